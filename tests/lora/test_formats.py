"""LoRA loading: every Wan format vs diffusers' ``load_lora_weights`` + ``set_adapters`` on tiny
random models (transformer output within 1e-5, video within 1e-3), full-delta keys, several
adapters, a mesh, Wan 2.2's two experts, and bad files."""

import json
import logging
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

import ditax  # noqa: E402
from ditax.cli import main  # noqa: E402
from ditax.errors import WeightError  # noqa: E402
from ditax.lora import parse_lora_arg, read_lora  # noqa: E402
from ditax.models.wan.lora_names import LORA_NAMES  # noqa: E402
from ditax.parallel import make_mesh  # noqa: E402
from lora_reference import (TOP_LINEARS, block_modules, load_into_diffusers,  # noqa: E402
                            random_lora, write_musubi, write_original, write_peft)
from wan_reference import make_diffusers_wan, rel_err, run_diffusers  # noqa: E402

LAYERS = 2
TOL = 1e-5


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """(folder, fresh-diffusers-model factory, inputs, base output) of one tiny Wan."""
    from diffusers import WanTransformer3DModel

    _, folder = make_diffusers_wan(tmp_path_factory.mktemp("wan"), layers=LAYERS)
    rng = np.random.default_rng(0)
    inputs = (rng.standard_normal((1, 4, 2, 4, 6)).astype(np.float32),
              np.array([700.0], np.float32), rng.standard_normal((1, 5, 32)).astype(np.float32))

    def fresh():
        return WanTransformer3DModel.from_pretrained(folder).eval()

    return folder, fresh, inputs, run_diffusers(fresh(), *inputs)


def _ours(folder, inputs, **kw):
    return np.asarray(ditax.load_transformer(folder, **kw)(*inputs))


def _original(tmp, m):
    """lora_down/lora_up with alpha on the blocks, diff_b everywhere, head.head as diff+diff_b."""
    lora = random_lora(m, block_modules(LAYERS), rank=4, alpha=8.0, bias=True, seed=1)
    lora.update(random_lora(m, TOP_LINEARS[:-1], rank=2, bias=True, seed=2))
    rng = np.random.default_rng(3)
    head = {"diffusion_model.head.head.diff": 0.05 * rng.standard_normal((16, 32)),
            "diffusion_model.head.head.diff_b": 0.05 * rng.standard_normal(16)}
    return write_original(tmp / "orig.safetensors", lora,
                          extra={k: v.astype(np.float32) for k, v in head.items()})


def _lora_ab(tmp, m):
    """ComfyUI names with lora_A / lora_B, no alpha, on every other layer and proj_out."""
    lora = random_lora(m, block_modules(LAYERS)[::2] + ["proj_out"], rank=3, seed=4)
    return write_original(tmp / "ab.safetensors", lora, names=("lora_A", "lora_B"))


def _musubi(tmp, m):
    return write_musubi(tmp / "musubi.safetensors",
                        random_lora(m, block_modules(LAYERS), rank=4, alpha=2.0, seed=5))


def _peft(tmp, m):
    lora = random_lora(m, block_modules(LAYERS) + list(TOP_LINEARS), rank=(4, 2), bias=True,
                       seed=6)
    return write_peft(tmp / "peft.safetensors", lora)


@pytest.mark.parametrize("make,fmt", [(_original, "original"), (_lora_ab, "original"),
                                      (_musubi, "musubi"), (_peft, "peft")])
def test_format_matches_diffusers(tmp_path, base, make, fmt):
    folder, fresh, inputs, plain = base
    m = fresh()
    path = make(tmp_path, m)
    assert read_lora(path, names=LORA_NAMES).format == fmt
    load_into_diffusers(m, path, "a", 0.7)
    want = run_diffusers(m, *inputs)
    assert rel_err(want, plain) > 1e-2  # the LoRA really changes the output
    got = _ours(folder, inputs, loras=[(path, 0.7)])
    assert rel_err(got, want) <= TOL, rel_err(got, want)


def test_two_adapters_with_their_own_strengths(tmp_path, base):
    folder, fresh, inputs, _ = base
    m = fresh()
    a, b = _peft(tmp_path, m), _musubi(tmp_path, m)
    load_into_diffusers(m, a, "a")
    load_into_diffusers(m, b, "b")
    m.set_adapters(["a", "b"], [0.6, -0.4])
    want = run_diffusers(m, *inputs)
    got = _ours(folder, inputs, loras=[(a, 0.6), (read_lora(b, names=LORA_NAMES), -0.4)])
    assert rel_err(got, want) <= TOL, rel_err(got, want)


def test_full_deltas_on_any_parameter_and_a_mesh(tmp_path, base):
    """``diff`` / ``diff_b`` on norms, modulation and the patch conv (diffusers drops these;
    ComfyUI adds them) equal the same deltas added to the torch weights; merged on a
    4 x 2 mesh the result is the single-device one."""
    folder, fresh, inputs, _ = base
    m = fresh()
    rng = np.random.default_rng(7)
    params = dict(m.named_parameters())
    deltas = {"blocks.0.norm2.weight": "blocks.0.norm3.diff",
              "blocks.0.norm2.bias": "blocks.0.norm3.diff_b",
              "blocks.1.attn1.norm_q.weight": "blocks.1.self_attn.norm_q.diff",
              "blocks.1.scale_shift_table": "blocks.1.modulation.diff",
              "scale_shift_table": "head.modulation.diff",
              "patch_embedding.weight": "patch_embedding.diff"}
    tensors = {}
    with torch.no_grad():
        for theirs, key in deltas.items():
            d = (0.3 * rng.standard_normal(tuple(params[theirs].shape))).astype(np.float32)
            tensors["diffusion_model." + key] = d
            params[theirs].add_(torch.from_numpy(0.5 * d))
    from safetensors.numpy import save_file

    path = tmp_path / "diff.safetensors"
    save_file(tensors, str(path))
    want = run_diffusers(m, *inputs)
    got = _ours(folder, inputs, loras=[(path, 0.5)])
    assert rel_err(got, want) <= TOL, rel_err(got, want)
    mesh = make_mesh({"fsdp": 4, "tensor": 2})
    lora = _peft(tmp_path, m)
    single = _ours(folder, inputs, loras=[(lora, 0.9), (path, 0.5)])
    tr = ditax.load_transformer(folder, mesh=mesh, loras=[(lora, 0.9), (path, 0.5)])
    k = tr.module.blocks.attn1.to_q.kernel[...]
    assert k.sharding.shard_shape(k.shape) != k.shape  # merged straight into the shards
    out = np.asarray(tr(*(np.repeat(x, 4, axis=0) for x in inputs)))   # batch 4 for fsdp=4
    assert max(rel_err(o[None], single) for o in out) <= TOL


def test_wan22_lora_on_each_expert(tmp_path):
    from ditax.pipelines.sampling import initial_noise
    from pipeline_reference import make_tiny_pipeline, run_diffusers as run_pipe

    ref, folder = make_tiny_pipeline(tmp_path, two_experts=True, boundary_ratio=0.8)
    hi = write_peft(tmp_path / "hi.safetensors",
                    random_lora(ref.transformer, block_modules(2), rank=4, bias=True, seed=8,
                                size=1.0))
    lo = write_original(tmp_path / "lo.safetensors",
                        random_lora(ref.transformer_2, block_modules(2), rank=4, alpha=4.0,
                                    seed=9, size=1.0))
    ref.load_lora_weights(str(hi), adapter_name="hi")
    ref.load_lora_weights(str(lo), adapter_name="lo", load_into_transformer_2=True)
    ref.transformer.set_adapters(["hi"], [0.8])
    ref.transformer_2.set_adapters(["lo"], [1.3])
    pipe = ditax.load_pipeline(folder, loras=[(hi, 0.8)], loras_2=[(lo, 1.3)])
    kw = dict(prompt="a cat walks on the grass", negative_prompt="blurry", height=32, width=32,
              num_frames=5, num_inference_steps=4, guidance_scale=4.0, guidance_scale_2=2.0)
    # the noise `seed=3` draws (pipe(seed=3) starts from it), so that the CLI run below is
    # compared with this one run of the pipeline
    lat = np.array(initial_noise(3, pipe.latent_shape(32, 32, 5)))   # a writable copy (torch)
    got = pipe(latents=lat, progress=False, **kw)
    want = run_pipe(ref, lat, **kw)
    assert np.abs(got - want).max() < 1e-3, np.abs(got - want).max()
    ref.transformer.disable_adapters()
    ref.transformer_2.disable_adapters()
    assert np.abs(run_pipe(ref, lat, **kw) - want).max() > 1e-2   # the LoRAs matter
    # the same through `ditax generate --lora --lora-2` (PNG frames: the video in uint8)
    import imageio.v2 as imageio
    from ditax.io.video import to_uint8

    frames = tmp_path / "frames"
    rc = main(["generate", "--model", str(folder), "--prompt", kw["prompt"], "--negative-prompt",
               "blurry", "--height", "32", "--width", "32", "--frames", "5", "--steps", "4",
               "--guidance", "4", "--guidance-2", "2", "--seed", "3", "--no-progress",
               "--lora", f"{hi}:0.8", "--lora-2", f"{lo}:1.3", "--output",
               str(tmp_path / "o.mp4"), "--frames-dir", str(frames), "attention.backend=xla"])
    assert rc == 0
    np.testing.assert_array_equal(imageio.imread(frames / "frame_00003.png"), to_uint8(got)[3])
    # loras_2 needs a second expert
    single = tmp_path / "single"
    shutil.copytree(folder, single, ignore=shutil.ignore_patterns("transformer_2"))
    index = json.loads((single / "model_index.json").read_text())
    index.pop("transformer_2"), index.pop("boundary_ratio", None)
    (single / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(ditax.DitaxError, match="no transformer_2"):
        ditax.load_pipeline(single, loras_2=[lo])


def _save(path, tensors):
    from safetensors.numpy import save_file

    save_file({k: np.asarray(v, np.float32) for k, v in tensors.items()}, str(path))
    return path


def test_bad_files(tmp_path, base, caplog):
    folder, fresh, inputs, plain = base
    m = fresh()
    good = random_lora(m, ["blocks.0.attn1.to_q"], rank=2, seed=10)["blocks.0.attn1.to_q"]
    q = "diffusion_model.blocks.0.self_attn.q"
    ok = {f"{q}.lora_down.weight": good["down"], f"{q}.lora_up.weight": good["up"]}
    # unknown keys: an error listing them; strict=False skips them with a warning
    extra = _save(tmp_path / "extra.safetensors",
                  dict(ok, **{"diffusion_model.blocks.0.self_attn.qq.lora_down.weight": [[1.0]],
                              "diffusion_model.foo.alpha": 1.0}))
    with pytest.raises(WeightError, match=r"2 key\(s\) match no layer.*self_attn\.qq.*foo"):
        ditax.load_transformer(folder, loras=[extra])
    with caplog.at_level(logging.WARNING):
        lenient = _ours(folder, inputs, loras=[(extra, 0.5)], lora_strict=False)
    assert "self_attn.qq" in caplog.text
    strict = _ours(folder, inputs, loras=[(_save(tmp_path / "ok.safetensors", ok), 0.5)])
    np.testing.assert_array_equal(lenient, strict)
    assert rel_err(strict, plain) > 1e-4  # one layer at 0.5: small, but there
    # a broken pair, a width that does not fit, more blocks than the model, an I2V layer
    cases = {
        "pair": (dict(ok, **{f"{q}.lora_up.weight": good["up"][:, :1]}),
                 r"lora_down.*\(2, 32\).*lora_up.*\(32, 1\)"),
        "width": ({f"{q}.lora_down.weight": np.ones((2, 48)), f"{q}.lora_up.weight":
                   np.ones((48, 2))}, r"blocks\.0\.attn1\.to_q: .*\(48, 48\).*\(32, 32\)"),
        "layers": ({k.replace("blocks.0", "blocks.5"): v for k, v in ok.items()},
                   r"blocks up to 5, the model has 2"),
        "i2v": ({k.replace("self_attn.q.", "cross_attn.k_img."): v for k, v in ok.items()},
                r"add_k_proj: no such weight"),
        "alone": ({f"{q}.lora_down.weight": good["down"]}, r"no matching lora_up"),
        "other": ({"lora_te_text_model_encoder_layers_0.lora_down.weight": np.ones((2, 2))},
                  r"not a Wan LoRA"),
    }
    for name, (tensors, pattern) in cases.items():
        path = _save(tmp_path / f"{name}.safetensors", tensors)
        with pytest.raises(WeightError, match=pattern):
            ditax.load_transformer(folder, loras=[path])


def test_cli_lora_arguments(tmp_path, capsys):
    assert parse_lora_arg("a/b.safetensors:0.75") == ("a/b.safetensors", 0.75)
    assert parse_lora_arg("a/b.safetensors") == ("a/b.safetensors", 1.0)
    assert parse_lora_arg("c:/x.safetensors") == ("c:/x.safetensors", 1.0)
    bad = _save(tmp_path / "bad.safetensors", {"foo.bar": np.ones(2)})
    for flag, path in (("--lora", bad), ("--lora-2", tmp_path / "missing.safetensors:0.5")):
        rc = main(["generate", "--model", "demo", "--prompt", "x", flag, str(path)])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and len(err.splitlines()) == 1, err
        assert ("not a Wan LoRA" in err) if flag == "--lora" else ("no such weights file" in err)


def test_cli_lora_mode_and_strict(tmp_path, capsys, caplog):
    """``--lora-mode`` and ``--lora-strict/--no-lora-strict`` reach load_pipeline; a file with
    unknown keys is exit 2 naming them and the flag, or read with a warning when not strict."""
    import inspect

    from ditax.cli import build_parser
    from ditax.cli.generate import parse_request

    q = "diffusion_model.blocks.0.self_attn.q"
    extra = _save(tmp_path / "extra.safetensors",
                  {f"{q}.lora_down.weight": np.ones((2, 32)), f"{q}.lora_up.weight":
                   np.ones((32, 2)), "diffusion_model.foo.lora_down.weight": np.ones((2, 2))})
    _, parser, _ = build_parser("generate")
    base_args = ["--model", "demo", "--prompt", "x", "--lora", f"{extra}:0.5"]
    with caplog.at_level(logging.WARNING):
        load = parse_request(parser.parse_intermixed_args(
            base_args + ["--lora-mode", "unmerged", "--no-lora-strict"])).load.kwargs()
    assert "diffusion_model.foo.lora_down.weight" in caplog.text
    assert (load["lora_mode"], load["lora_strict"]) == ("unmerged", False)
    assert [r.key for r in load["loras"][0][0].rows] == ["blocks.0.attn1.to_q"]
    assert load["loras"][0][1] == 0.5
    inspect.signature(ditax.load_pipeline).bind("demo", **load)   # each key: an argument
    load = parse_request(parser.parse_intermixed_args(base_args[:4])).load.kwargs()
    assert (load["lora_mode"], load["lora_strict"], load["loras"]) == ("merged", True, [])
    for extra_args, words in ((["--lora-strict"], ("foo.lora_down.weight", "--no-lora-strict")),
                              (["--lora-mode", "fused"], ("--lora-mode", "'fused'"))):
        assert main(["generate", *base_args, *extra_args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and all(w in err[0] for w in words), err


def test_unmerged_equals_merged_and_new_strengths_do_not_recompile(tmp_path, base):
    from compiles import compiles

    folder, fresh, inputs, plain = base
    m = fresh()
    a = _peft(tmp_path, m)
    b = write_musubi(tmp_path / "mu.safetensors",
                     random_lora(m, block_modules(LAYERS)[3:], rank=(2, 5), alpha=3.0, seed=11))
    loras = [(a, 0.6), (read_lora(b, names=LORA_NAMES), -0.4)]
    merged = _ours(folder, inputs, loras=loras)
    mesh = make_mesh({"context": 4, "tensor": 2})
    tr = ditax.load_transformer(folder, loras=loras, lora_mode="unmerged", mesh=mesh)
    assert rel_err(np.asarray(tr(*inputs)), merged) <= TOL
    with compiles() as log:
        tr.set_lora_strengths([1.1, 0.3])
        again = np.asarray(tr(*inputs))
    assert log.names == [], log.names
    want = _ours(folder, inputs, loras=[(a, 1.1), (b, 0.3)])
    assert rel_err(again, want) <= TOL, rel_err(again, want)
    tr.set_lora_strengths([0.0, 0.0])
    assert rel_err(np.asarray(tr(*inputs)), plain) <= TOL
    with pytest.raises(WeightError, match=r"proj_out\.weight is a full delta.*load it merged"):
        ditax.load_transformer(folder, loras=[_original(tmp_path, m)], lora_mode="unmerged")
