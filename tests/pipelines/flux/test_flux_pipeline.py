"""FLUX.1 text-to-image (``ditax.load_pipeline`` on a diffusers ``FluxPipeline`` folder) against
diffusers' ``FluxPipeline`` from the same packed latents: dev-style (guidance embedding,
dynamic shift, true CFG with a negative prompt, a second T5 prompt) and schnell-style (neither);
the request errors."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

import ditax  # noqa: E402
from ditax.errors import RequestError  # noqa: E402
from flux_reference import make_tiny_flux_pipeline  # noqa: E402

SIZE = 32          # pixels; the tiny VAE's 2x and the 2x2 packing: 16 x 16 latents, 64 tokens
TOKENS, CH = (SIZE // 4) ** 2, 4
CASES = {
    "dev": dict(guidance_embeds=True, call=dict(
        num_inference_steps=3, guidance_scale=3.5, negative_prompt="blurry, low quality",
        true_cfg_scale=2.0, prompt_2="a dog runs along the beach")),
    "schnell": dict(guidance_embeds=False, call=dict(num_inference_steps=2)),
}


@pytest.fixture(scope="module")
def pipes(tmp_path_factory):
    """name -> (diffusers pipeline, ditax pipeline) of the tiny folders."""
    tmp = tmp_path_factory.mktemp("flux_pipe")
    out = {}
    for name, case in CASES.items():
        ref, folder = make_tiny_flux_pipeline(tmp, guidance_embeds=case["guidance_embeds"])
        out[name] = ref, ditax.load_pipeline(folder)
        out[name + "_folder"] = folder
    return out


def test_generate_writes_a_png_and_refuses_video_flags(pipes, tmp_path, capsys, monkeypatch):
    """``ditax generate`` on a FluxPipeline folder: a PNG of the pipeline's image from the
    seed's noise; each video-only flag refused in one line (exit 2) before loading. (The
    folder's pipeline is the one loaded above: load_pipeline's dispatch is tested there.)"""
    from ditax.cli import main

    loaded = []
    monkeypatch.setattr(ditax, "load_pipeline",
                        lambda path, **kw: loaded.append(kw) or pipes["schnell"][1])
    folder, out = str(pipes["schnell_folder"]), tmp_path / "x.png"
    base = ["generate", "--model", folder, "--prompt", "a cat", "--height", str(SIZE),
            "--width", str(SIZE), "--steps", "2", "--seed", "3", "--no-progress",
            "sample.max_sequence_length=16"]
    # a flag of another family is refused naming the family whose it is
    for flags, words in ((["--frames", "5"], "--frames is not taken by flux models"),
                         (["--image", "a.png"], "--image is not taken by flux models"),
                         (["--fps", "8"], "--fps is not taken by flux models"),
                         (["--height", "30"], "height=30 must be a positive multiple of"),
                         (["--output", str(tmp_path / "x.mp4")], "must end in .png")):
        rc = main(base + flags + ([] if words == "must end in .png" else
                                  ["--output", str(out)]))
        err = capsys.readouterr().err.strip()
        assert rc == 2 and words in err and len(err.splitlines()) == 1, err
    assert main(base + ["--output", str(out)]) == 0
    assert loaded and loaded[0]["dtype"] == "float32" and loaded[0]["cfg_mode"] == "batched"
    import imageio.v2 as imageio

    png = imageio.imread(out)
    want = pipes["schnell"][1]("a cat", height=SIZE, width=SIZE, num_inference_steps=2, seed=3,
                               max_sequence_length=16, progress=False)
    assert png.shape == (SIZE, SIZE, 3) and png.dtype == np.uint8
    assert np.abs(png.astype(np.float32) / 255 - want).max() <= 0.5 / 255 + 1e-6


def test_generate_true_cfg_equals_the_python_call(pipes, tmp_path, capsys, monkeypatch):
    """``ditax generate --negative-prompt N --true-cfg S`` on the dev folder writes the PNG of
    ``pipe(prompt, negative_prompt=N, true_cfg_scale=S)`` from the same seed; either flag alone
    and ``--true-cfg`` on a video model are refused in one line (exit 2)."""
    import imageio.v2 as imageio

    from ditax.cli import main

    monkeypatch.setattr(ditax, "load_pipeline", lambda path, **kw: pipes["dev"][1])
    out = tmp_path / "cfg.png"
    base = ["generate", "--model", str(pipes["dev_folder"]), "--prompt", "a cat", "--height",
            str(SIZE), "--width", str(SIZE), "--steps", "2", "--seed", "4", "--no-progress",
            "--output", str(out), "sample.max_sequence_length=16"]
    for flags in (["--negative-prompt", "blurry"], ["--true-cfg", "2"]):
        assert main(base + flags) == 2
        err = capsys.readouterr().err.strip()
        assert "--negative-prompt and --true-cfg go together" in err, err
        assert len(err.splitlines()) == 1
    assert main(base + ["--negative-prompt", "blurry", "--true-cfg", "2"]) == 0
    want = pipes["dev"][1]("a cat", height=SIZE, width=SIZE, num_inference_steps=2, seed=4,
                           negative_prompt="blurry", true_cfg_scale=2.0,
                           max_sequence_length=16, progress=False)
    # the negative prompt matters (the same program: the prompt itself as negative = no CFG)
    plain = pipes["dev"][1]("a cat", height=SIZE, width=SIZE, num_inference_steps=2, seed=4,
                            negative_prompt="a cat", true_cfg_scale=2.0,
                            max_sequence_length=16, progress=False)
    png = imageio.imread(out).astype(np.float32) / 255
    assert np.abs(png - want).max() <= 0.5 / 255 + 1e-6
    assert np.abs(want - plain).max() > 10 / 255
    assert main(["generate", "--model", "demo", "--prompt", "a cat", "--true-cfg", "2"]) == 2
    err = capsys.readouterr().err
    assert "--true-cfg is not taken by wan models" in err and "for flux models" in err, err


def _latents(seed=0):
    return np.random.default_rng(seed).standard_normal((1, TOKENS, CH)).astype(np.float32)


@pytest.mark.parametrize("name", list(CASES))
def test_flux_pipeline_matches_diffusers(pipes, name):
    ref, pipe = pipes[name]
    assert type(pipe).__name__ == "FluxTextToImage"
    call = dict(CASES[name]["call"], height=SIZE, width=SIZE, max_sequence_length=16)
    lat = _latents()
    with torch.no_grad():
        want = ref("a cat walks on the grass", latents=torch.from_numpy(lat), output_type="np",
                   **call).images[0]
    got = pipe("a cat walks on the grass", latents=lat, progress=False, **call)
    err = float(np.abs(got - want).max())
    inside = float(np.mean((want > 0.01) & (want < 0.99)))
    print(f"flux {name}: image {got.shape} max abs err {err:.2e} ({inside:.0%} pixels unclipped)")
    assert got.shape == want.shape == (SIZE, SIZE, 3) and got.dtype == np.float32
    assert inside > 0.5 and err < 1e-3
    assert pipe.last_stats["transformer_calls"] == call["num_inference_steps"] * (
        2 if "negative_prompt" in call else 1)
    if name == "dev":   # the dynamic shift's schedule itself (mu of 64 tokens), as diffusers'
        n = call["num_inference_steps"]
        state = pipe.scheduler.with_mu(TOKENS).set_timesteps(
            n, sigmas=np.linspace(1.0, 1.0 / n, n))
        np.testing.assert_allclose(np.asarray(state.sigmas), ref.scheduler.sigmas.numpy(),
                                   rtol=1e-6)


def test_flux_pipeline_on_a_mesh(pipes):
    """fsdp2 x context2 with ulysses, true CFG batched over fsdp: diffusers' image (the
    prediction comes back replicated, so the step program's carry keeps one sharding)."""
    ref, _ = pipes["dev"]
    mesh = ditax.make_mesh(dict(fsdp=2, context=2), devices=__import__("jax").devices()[:4])
    pipe = ditax.load_pipeline(pipes["dev_folder"], mesh=mesh, attention="ulysses")
    call = dict(height=SIZE, width=SIZE, num_inference_steps=2, max_sequence_length=16,
                negative_prompt="blurry", true_cfg_scale=2.0)
    lat = _latents(1)
    with torch.no_grad():
        want = ref("a cat", latents=torch.from_numpy(lat), output_type="np", **call).images[0]
    err = float(np.abs(pipe("a cat", latents=lat, progress=False, **call) - want).max())
    print(f"flux dev on fsdp2 x context2 (ulysses): max abs err {err:.2e}")
    assert err < 1e-3


def test_flux_pipeline_errors_and_seed(pipes):
    _, pipe = pipes["schnell"]
    kw = dict(height=SIZE, width=SIZE, num_inference_steps=2, max_sequence_length=16,
              progress=False)
    with pytest.raises(RequestError, match=r"height=30 must be a positive multiple of 4"):
        pipe("a cat", **{**kw, "height": 30})
    with pytest.raises(RequestError, match="pass negative_prompt="):
        pipe("a cat", true_cfg_scale=3.0, **kw)
    with pytest.raises(RequestError, match=r"latents shape \(1, 16, 4\) does not match "
                                           r"\(1, 64, 4\)"):
        pipe("a cat", latents=_latents()[:, :16], **kw)
    with pytest.raises(RequestError, match="max_sequence_length=600"):
        pipe("a cat", **{**kw, "max_sequence_length": 600})
    # from a seed: reproducible, and another seed gives another image
    a, b, c = (pipe("a cat", seed=s, **kw) for s in (1, 1, 2))
    np.testing.assert_array_equal(a, b)
    assert np.abs(a - c).max() > 1e-3
