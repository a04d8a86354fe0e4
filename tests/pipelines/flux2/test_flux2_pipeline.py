"""FLUX.2 pipelines (``ditax.load_pipeline`` on diffusers ``Flux2KleinPipeline`` /
``Flux2Pipeline`` folders): the token layout, position ids, schedule and reference-image
preparation against diffusers' own static methods on random inputs; end to end against
diffusers from the same latents (klein text-only, klein with two reference images, dev);
``ditax generate``; the request errors."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

from diffusers.pipelines.flux2.pipeline_flux2 import (  # noqa: E402
    Flux2Pipeline, compute_empirical_mu)

from ditax.errors import RequestError  # noqa: E402
from ditax.pipelines.flux2 import layout  # noqa: E402
from ditax.pipelines.flux2.references import prepare_reference  # noqa: E402
from ditax.pipelines.flux2.schedule import empirical_mu, request_scheduler  # noqa: E402
from flux2_pipeline_reference import diffusers_reference_image  # noqa: E402


def test_layout_and_ids_match_diffusers():
    """pack / unpack and the position ids of the output, of two
    reference images of different sizes and of the text, as diffusers' static methods."""
    rng = np.random.default_rng(0)
    z = rng.standard_normal((2, 3, 8, 12)).astype(np.float32)
    p = Flux2Pipeline._patchify_latents(torch.from_numpy(z))
    tokens = Flux2Pipeline._pack_latents(p)
    np.testing.assert_array_equal(layout.pack(p.numpy()), tokens.numpy())
    ids = Flux2Pipeline._prepare_latent_ids(p)
    np.testing.assert_array_equal(layout.latent_ids(4, 6), ids[0].numpy())
    back = Flux2Pipeline._unpack_latents_with_ids(tokens, ids)
    np.testing.assert_array_equal(layout.unpack(tokens.numpy(), 4, 6), back.numpy())
    refs = [torch.zeros(1, 12, 3, 5), torch.zeros(1, 12, 2, 2)]
    np.testing.assert_array_equal(layout.reference_ids([(3, 5), (2, 2)]),
                                  Flux2Pipeline._prepare_image_ids(refs)[0].numpy())
    np.testing.assert_array_equal(layout.text_ids(7),
                                  Flux2Pipeline._prepare_text_ids(torch.zeros(1, 7, 3))[0].numpy())


def test_schedule_matches_diffusers():
    """FLUX.2's empirical mu (both branches, several step counts) and the shifted sigmas of
    diffusers' scheduler set with that mu."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    from ditax.schedulers import FlowMatchEulerScheduler

    for seq, steps in ((64, 3), (1024, 28), (4096, 50), (4301, 4), (9000, 50)):
        assert empirical_mu(seq, steps) == pytest.approx(compute_empirical_mu(seq, steps),
                                                         rel=1e-12)
    cfg = dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True,
               base_shift=0.5, max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096)
    ref = FlowMatchEulerDiscreteScheduler(**cfg)
    ours = FlowMatchEulerScheduler.from_config(cfg)
    for seq, steps in ((64, 3), (4096, 28)):
        sigmas = np.linspace(1.0, 1 / steps, steps)
        ref.set_timesteps(sigmas=sigmas, mu=compute_empirical_mu(seq, steps))
        state = request_scheduler(ours, seq, steps).set_timesteps(steps, sigmas=sigmas)
        np.testing.assert_allclose(np.asarray(state.sigmas), ref.sigmas.numpy(), rtol=1e-6)
        np.testing.assert_allclose(np.asarray(state.timesteps), ref.timesteps.numpy(),
                                   rtol=1e-6)


def test_reference_images_prepared_as_diffusers():
    """Random PIL images (one over the 1024^2 area cap, odd sizes, an RGBA one) → the same
    tensors as diffusers' preparation; too small / too narrow images refused in one line."""
    import PIL.Image

    rng = np.random.default_rng(1)
    for (h, w, mode), factor in (((70, 133, "RGB"), 8), ((1030, 1050, "RGB"), 8),
                                 ((97, 64, "RGBA"), 2)):
        px = rng.integers(0, 256, (h, w, len(mode)), dtype=np.uint8)
        image = PIL.Image.fromarray(px, mode)
        want = diffusers_reference_image(image, factor)
        got = prepare_reference(image, 2 * factor)
        assert got.shape == want.shape and got.dtype == np.float32, (got.shape, want.shape)
        np.testing.assert_allclose(got, want, atol=1e-6)
    for size, words in (((63, 100), "both sides >= 64"), ((64, 600), "at most 8:1")):
        with pytest.raises(RequestError, match=words) as e:
            prepare_reference(PIL.Image.new("RGB", size), 16)
        assert len(str(e.value).splitlines()) == 1
    with pytest.raises(RequestError, match="PIL image or a uint8"):
        prepare_reference("cat.png", 16)


# --- end to end, against diffusers from the same latents -------------------------------------

import json  # noqa: E402

import ditax  # noqa: E402
from flux2_pipeline_reference import (  # noqa: E402
    TEXT_LAYERS, random_latents, run_diffusers, write_flux2_pipeline)

SIZE = 32          # pixels; the tiny VAE's 2x and the 2x2 patch: 8 x 8 tokens
PROMPT = "a cat walks on the grass"
CALL = dict(height=SIZE, width=SIZE, num_inference_steps=2, max_sequence_length=24)


def _refs():
    """Two reference images of different sizes (64 px is the smallest diffusers takes)."""
    import PIL.Image

    rng = np.random.default_rng(5)
    return [PIL.Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)),
            PIL.Image.fromarray(rng.integers(0, 256, (72, 96, 3), dtype=np.uint8))]


def _distilled_twin(base, folder):
    """``folder``: the klein base folder's components (linked) under a model_index.json that
    says ``is_distilled``."""
    folder.mkdir()
    for part in base.iterdir():
        if part.is_dir():
            (folder / part.name).symlink_to(part)
    index = json.loads((base / "model_index.json").read_text())
    (folder / "model_index.json").write_text(json.dumps({**index, "is_distilled": True}))


@pytest.fixture(scope="module")
def klein(tmp_path_factory):
    """``(diffusers Flux2KleinPipeline (base), ditax base pipeline, ditax distilled pipeline,
    base folder)``: one tiny klein folder (its Qwen3 deep enough for klein's own text layers
    9, 18, 27: every call on the defaults) and its distilled twin."""
    tmp = tmp_path_factory.mktemp("flux2_pipe")
    ref = write_flux2_pipeline(tmp / "klein", "klein-base", deep_text=True)
    _distilled_twin(tmp / "klein", tmp / "klein_distilled")
    base, distilled = (ditax.load_pipeline(tmp / n) for n in ("klein", "klein_distilled"))
    return ref, base, distilled, tmp / "klein"


def _compare(name, got, want, tol=1e-3):
    err = float(np.abs(got - want).max())
    inside = float(np.mean((want > 0.01) & (want < 0.99)))
    print(f"flux2 {name}: image {got.shape} max abs err {err:.2e} ({inside:.0%} unclipped)")
    assert got.shape == want.shape and got.dtype == np.float32
    assert inside > 0.5 and err < tol
    return err


def test_klein_distilled_text_to_image_matches_diffusers(klein):
    """A distilled klein folder: one forward a step (no CFG, as diffusers switches it)."""
    ref, _, pipe, _ = klein
    assert pipe.kind == "klein-distilled"
    lat = random_latents(pipe, SIZE, SIZE)
    ref.register_to_config(is_distilled=True)
    try:
        want = run_diffusers(ref, PROMPT, lat, None, guidance_scale=1.0, **CALL)
    finally:
        ref.register_to_config(is_distilled=False)
    _compare("klein distilled", pipe(PROMPT, latents=lat, progress=False, **CALL), want)
    assert pipe.last_stats["transformer_calls"] == CALL["num_inference_steps"]


def test_klein_base_two_references_with_cfg_matches_diffusers(klein):
    """klein base, true CFG (against "", as diffusers) and two reference images of different
    sizes, from diffusers' latent layout."""
    ref, pipe, _, _ = klein
    lat = random_latents(pipe, SIZE, SIZE, seed=1)
    want = run_diffusers(ref, PROMPT, lat, None, image=_refs(), guidance_scale=3.0, **CALL)
    got = pipe(PROMPT, image=_refs(), latents=lat, guidance_scale=3.0, progress=False, **CALL)
    _compare("klein base + 2 references", got, want)
    assert pipe.last_stats["transformer_calls"] == 2 * CALL["num_inference_steps"]


def test_generate_writes_the_png_of_the_call(klein, tmp_path, capsys):
    """``ditax generate`` on a klein folder (on its defaults: klein's own text layers) with
    ``--image`` + ``--reference-image``: the PNG of ``pipe(prompt, image=[both], seed=...)``;
    flags the family does not take and bad values refused in one line (exit 2) before any
    work."""
    import imageio.v2 as imageio
    import PIL.Image

    from ditax.cli import main

    _, pipe, _, folder = klein
    files = []
    for i, im in enumerate(_refs()):
        files.append(tmp_path / f"ref{i}.png")
        im.save(files[-1])
    PIL.Image.new("RGB", (40, 64)).save(tmp_path / "small.png")
    out = tmp_path / "x.png"
    base = ["generate", "--model", str(folder), "--prompt", PROMPT, "--height", str(SIZE),
            "--width", str(SIZE), "--steps", "2", "--seed", "3", "--guidance", "3",
            "--no-progress", "sample.max_sequence_length=24"]
    refs = ["--image", str(files[0]), "--reference-image", str(files[1])]
    for flags, words in ((["--frames", "5"], "--frames is not taken by flux2 models"),
                         (["--true-cfg", "2"], "--true-cfg is not taken by flux2 models"),
                         (["--height", "30"], "height=30 must be a positive multiple of 4"),
                         (["--last-image", str(files[0])], "--last-image"),
                         (["--image", str(tmp_path / "no.png")], "is not a file"),
                         (["--reference-image", str(tmp_path / "small.png")],
                          "needs both sides >= 64"),
                         (["--guidance", "1", "--negative-prompt", "blurry"],
                          "negative_prompt is read only with CFG"),
                         (["--output", str(tmp_path / "x.mp4")], "must end in .png")):
        rc = main(base + flags + ([] if words == "must end in .png" else
                                  ["--output", str(out)]))
        err = capsys.readouterr().err.strip()
        assert rc == 2 and words in err and len(err.splitlines()) == 1, (flags, err)
    assert main(base + refs + ["--output", str(out)]) == 0
    png = imageio.imread(out).astype(np.float32) / 255
    want = pipe(PROMPT, image=_refs(), seed=3, guidance_scale=3.0, progress=False, **CALL)
    assert png.shape == (SIZE, SIZE, 3)
    assert np.abs(png - want).max() <= 0.5 / 255 + 1e-6


def test_bad_calls_are_one_line_request_errors(klein):
    """A dozen wrong inputs to the Python call: each one RequestError line naming the value,
    before any encoding or compiling."""
    import PIL.Image

    _, base, distilled, _ = klein
    lat = random_latents(base, SIZE, SIZE)
    cases = [
        (base, dict(prompt=None), "prompt must be one string"),
        (base, dict(prompt="  "), "prompt is empty"),
        (base, dict(height=30), "height=30 must be a positive multiple of 4"),
        (base, dict(num_inference_steps=0), "num_inference_steps=0"),
        (base, dict(guidance_scale=float("nan")), "guidance_scale=nan"),
        (base, dict(guidance_scale=1.0, negative_prompt="blurry"), "read only with CFG"),
        (distilled, dict(guidance_scale=4.0), "step-distilled"),
        (distilled, dict(negative_prompt="blurry"), "runs no CFG"),
        (base, dict(latents=lat[:, :, :4]), "latents shape (1, 32, 4, 8) does not match"),
        (base, dict(text_encoder_out_layers=(1, 2)), "joint_attention_dim"),
        (base, dict(text_encoder_out_layers=(9, 18, 28)), "hidden states 0..27"),
        (base, dict(max_sequence_length=0), "max_sequence_length=0"),
        (base, dict(image=PIL.Image.new("RGB", (64, 600))), "at most 8:1"),
        (base, dict(image=["a.png"]), "got a path"),
        (base, dict(sigmas=[1.0, 0.5, 0.2]), "sigmas has 3 values"),
        (base, dict(generator=object()), "pass an int seed"),
        (base, dict(output="pil"), "output='pil'"),
    ]
    for pipe, kw, words in cases:
        call = {**CALL, "prompt": PROMPT, **kw}
        with pytest.raises(RequestError) as e:
            pipe.prepare(**call)
        msg = str(e.value)
        assert words in msg and len(msg.splitlines()) == 1, (kw, msg)
    for kw, words in ((dict(prompt_embeds=np.zeros((1, 24, 96))), "pass prompt="),
                      (dict(num_images_per_prompt=2), "its own seed"), (dict(steps=2), "steps=")):
        with pytest.raises(RequestError, match=words):
            base(PROMPT, **kw)


def test_dev_text_to_image_matches_diffusers(tmp_path):
    """FLUX.2 dev (Mistral-3 text with its system message, embedded guidance, one forward a
    step) from diffusers' latents, text-only and with one reference image; its text long
    enough to hold the prompt after the system message. A negative prompt is refused (dev
    runs no CFG)."""
    ref = write_flux2_pipeline(tmp_path / "dev", "dev")
    pipe = ditax.load_pipeline(tmp_path / "dev")
    pipe.text_encoder_out_layers = TEXT_LAYERS
    assert pipe.kind == "dev"
    call = dict(CALL, max_sequence_length=128, guidance_scale=2.5)
    lat = random_latents(pipe, SIZE, SIZE, seed=2)
    want = run_diffusers(ref, PROMPT, lat, **call)
    _compare("dev", pipe(PROMPT, latents=lat, progress=False, **call), want)
    assert pipe.last_stats["transformer_calls"] == CALL["num_inference_steps"]
    one = _refs()[1]                     # one reference, given alone (not in a list)
    want = run_diffusers(ref, PROMPT, lat, image=one, **call)
    _compare("dev + 1 reference", pipe(PROMPT, image=one, latents=lat, progress=False, **call),
             want)
    with pytest.raises(RequestError, match="guidance-distilled"):
        pipe.prepare(PROMPT, negative_prompt="blurry", **CALL)


def test_serve_requests_take_a_reference_image(klein, tmp_path):
    """``ditax serve``'s request check on a klein folder: a base64 ``image`` becomes the call's
    reference image (a PIL image; a list: several, the batch key holding their sizes), the job
    an image job; an empty list, a non-image entry, a video field and a negative prompt
    without CFG are 400s naming the JSON field."""
    import base64
    import io
    from ditax.serve.requests import BadRequest, check_body

    buf = io.BytesIO()
    _refs()[0].save(buf, format="PNG")
    b64 = base64.b64encode(buf.getvalue()).decode()
    folder = str(klein[3])

    def check(body):
        return check_body({"prompt": PROMPT, "size": f"{SIZE}x{SIZE}", **body}, folder,
                          ["sample.max_sequence_length=24"], str(tmp_path / "x.png"))

    got = check({"image": b64, "guidance_scale": 3.0})
    assert got.load.makes == "image" and got.call["image"].size == (64, 64)
    assert got.call["guidance_scale"] == 3.0 and got.stored["image"] == b64
    # several references: a list; the batch key holds their sizes (their token counts)
    small = io.BytesIO()
    _refs()[0].resize((64, 96)).save(small, format="PNG")
    b64_small = base64.b64encode(small.getvalue()).decode()
    two = check({"image": [b64, b64_small], "guidance_scale": 3.0})
    assert [im.size for im in two.call["image"]] == [(64, 64), (64, 96)]
    assert two.stored["image"] == [b64, b64_small] and two.batch_key != got.batch_key
    assert check({"image": [b64_small, b64], "guidance_scale": 3.0}).batch_key != two.batch_key
    assert check({"image": [b64, b64_small], "guidance_scale": 3.0}).batch_key == two.batch_key
    for body, param in (({"num_frames": 5}, "num_frames"),
                        ({"image": []}, "image"), ({"image": [b64, 7]}, "image[1]"),
                        ({"negative_prompt": "x", "guidance_scale": 1.0}, "negative_prompt")):
        with pytest.raises(BadRequest) as e:
            check(body)
        assert e.value.param == param and len(str(e.value).splitlines()) == 1, str(e.value)


def test_klein_references_on_a_mesh(klein):
    """fsdp2 x context2 with ulysses (the reference tokens in the sharded sequence), CFG
    batched over fsdp, the decode's rows split over the mesh (vae_parallel): diffusers'
    image."""
    import jax

    ref, _, _, folder = klein
    mesh = ditax.make_mesh(dict(fsdp=2, context=2), devices=jax.devices()[:4])
    pipe = ditax.load_pipeline(folder, mesh=mesh, attention="ulysses", vae_parallel=True)
    lat = random_latents(pipe, SIZE, SIZE, seed=1)
    want = run_diffusers(ref, PROMPT, lat, None, image=_refs(), guidance_scale=3.0, **CALL)
    got = pipe(PROMPT, image=_refs(), latents=lat, guidance_scale=3.0, progress=False, **CALL)
    _compare("klein base + 2 references on fsdp2 x context2 (ulysses, vae_parallel)", got, want)


def test_size_not_given_is_the_first_references(klein):
    """diffusers' rule: each side not given is the first reference image's (after its crop to
    the grid); given sides stay (no work is done: the request's layout only)."""
    _, pipe, _, _ = klein
    refs = _refs()[::-1]                              # 72x96 first: 72 rows, 96 columns
    c = pipe.transformer.config.in_channels
    for size, (h, w) in ((dict(), (72, 96)), (dict(width=32), (72, 32)),
                         (dict(height=32, width=32), (32, 32))):
        p = pipe.prepare(PROMPT, image=refs, **size)
        assert p.latent_shape == (1, (h // 4) * (w // 4), c), (size, p.latent_shape)
    assert pipe.prepare(PROMPT).latent_shape == (1, (1024 // 4) ** 2, c)   # FLUX.2's 1024^2
