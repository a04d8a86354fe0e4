"""BFL single-file FLUX.2 checkpoints: a tiny random diffusers ``Flux2Transformer2DModel`` written
under BFL's names (the inverse of diffusers' ``convert_flux2_transformer_checkpoint_to_diffusers``,
written out here from its facts, and checked by that converter mapping the file back to the
model's exact state dict), loaded by ``ditax.load_transformer(file, config=...)`` equal to
diffusers' output and to the diffusers folder's load; ``ditax convert`` (check, ``--out``,
``--quantize int8``); files that do not fit give one line naming the key and the fix."""

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

import ditax  # noqa: E402
from ditax.cli import main  # noqa: E402
from ditax.errors import WeightError  # noqa: E402
from ditax.models.flux2.config import Flux2Config  # noqa: E402
from flux2_reference import (KLEIN, TINY, flux2_inputs, make_diffusers_flux2,  # noqa: E402
                             run_diffusers_flux2)
from wan_reference import rel_err  # noqa: E402

pytestmark = pytest.mark.usefixtures("fast_compile")

COMFY = "model.diffusion_model."


def to_bfl(sd: dict, num_layers: int, num_single: int, prefix: str = "") -> dict:
    """A diffusers ``Flux2Transformer2DModel`` state dict (numpy) under BFL's keys: the double
    blocks' q / k / v fused into ``qkv``, RMSNorm gains as ``.scale``, the final modulation's
    halves back in BFL's order (shift, scale)."""
    sd, out = dict(sd), {}

    def put(bfl, *keys, swap=False):
        w = np.concatenate([sd.pop(k + ".weight") for k in keys], 0)
        if swap:
            w = np.concatenate(np.split(w, 2, 0)[::-1], 0)
        out[prefix + bfl + ".weight"] = w

    def norm(bfl, key):
        out[prefix + bfl + ".scale"] = sd.pop(key + ".weight")

    tge = "time_guidance_embed"
    for ours, theirs in (("img_in", "x_embedder"), ("txt_in", "context_embedder"),
                         ("final_layer.linear", "proj_out"),
                         ("time_in.in_layer", f"{tge}.timestep_embedder.linear_1"),
                         ("time_in.out_layer", f"{tge}.timestep_embedder.linear_2"),
                         ("guidance_in.in_layer", f"{tge}.guidance_embedder.linear_1"),
                         ("guidance_in.out_layer", f"{tge}.guidance_embedder.linear_2")):
        if theirs + ".weight" in sd:       # klein: no guidance embedder
            put(ours, theirs)
    for m in ("double_stream_modulation_img", "double_stream_modulation_txt",
              "single_stream_modulation"):
        put(f"{m}.lin", f"{m}.linear")
    put("final_layer.adaLN_modulation.1", "norm_out.linear", swap=True)
    for i in range(num_layers):
        b, t = f"double_blocks.{i}", f"transformer_blocks.{i}.attn"
        put(f"{b}.img_attn.qkv", *(f"{t}.to_{c}" for c in "qkv"))
        put(f"{b}.txt_attn.qkv", *(f"{t}.add_{c}_proj" for c in "qkv"))
        put(f"{b}.img_attn.proj", f"{t}.to_out.0")
        put(f"{b}.txt_attn.proj", f"{t}.to_add_out")
        for s, d in (("img", "ff"), ("txt", "ff_context")):
            put(f"{b}.{s}_mlp.0", f"transformer_blocks.{i}.{d}.linear_in")
            put(f"{b}.{s}_mlp.2", f"transformer_blocks.{i}.{d}.linear_out")
        norm(f"{b}.img_attn.norm.query_norm", f"{t}.norm_q")
        norm(f"{b}.img_attn.norm.key_norm", f"{t}.norm_k")
        norm(f"{b}.txt_attn.norm.query_norm", f"{t}.norm_added_q")
        norm(f"{b}.txt_attn.norm.key_norm", f"{t}.norm_added_k")
    for i in range(num_single):
        b, t = f"single_blocks.{i}", f"single_transformer_blocks.{i}.attn"
        put(f"{b}.linear1", f"{t}.to_qkv_mlp_proj")   # q, k, v, SwiGLU gate + value: as is
        put(f"{b}.linear2", f"{t}.to_out")
        norm(f"{b}.norm.query_norm", f"{t}.norm_q")
        norm(f"{b}.norm.key_norm", f"{t}.norm_k")
    assert not sd, sorted(sd)        # every diffusers tensor has a BFL home
    return out


def _state(m) -> dict:
    return {k: v.detach().numpy() for k, v in m.state_dict().items()}


@pytest.fixture(scope="module")
def klein(tmp_path_factory):
    """A klein-like model (no guidance embedding, out != in channels) as a diffusers folder,
    a BFL file, and the YAML of its architecture."""
    import yaml
    from safetensors.numpy import save_file

    tmp = tmp_path_factory.mktemp("flux2_bfl")
    m, folder = make_diffusers_flux2(tmp, seed=5, **KLEIN)
    sd = _state(m)
    tensors = to_bfl(sd, KLEIN["num_layers"], KLEIN["num_single_layers"])
    path = tmp / "flux-2-klein-tiny.safetensors"
    save_file(tensors, str(path))
    spec = tmp / "klein-tiny.yaml"
    spec.write_text(yaml.safe_dump({"name": "klein-tiny", "model": dict(KLEIN, family="flux2")}))
    cfg = Flux2Config.from_diffusers(dict(KLEIN))
    inputs = flux2_inputs(np.random.default_rng(0), KLEIN, text=5, guidance=False)
    return dict(m=m, folder=folder, sd=sd, tensors=tensors, path=path, spec=spec, cfg=cfg,
                inputs=inputs)


@pytest.mark.parametrize("config", [TINY, KLEIN], ids=["dev-like", "klein-like"])
def test_the_file_is_in_bfl_layout(config, tmp_path):
    """diffusers' own single-file converter maps the written file back to the model's state
    dict exactly (the guidance embedder too, for the dev-like model)."""
    from diffusers.loaders.single_file_utils import \
        convert_flux2_transformer_checkpoint_to_diffusers as convert

    m, _ = make_diffusers_flux2(tmp_path, seed=7, **config)
    sd = _state(m)
    bfl = to_bfl(sd, config["num_layers"], config["num_single_layers"])
    assert any(k.endswith("img_attn.qkv.weight") for k in bfl) and "img_in.weight" in bfl
    back = convert({k: torch.from_numpy(v) for k, v in bfl.items()})
    assert sorted(back) == sorted(sd)
    for k, v in sd.items():
        np.testing.assert_array_equal(back[k].numpy(), v, err_msg=k)


def test_bfl_file_equals_diffusers_and_the_folder(klein):
    """``ditax.load_transformer(FILE, config=...)``: within 1e-5 of diffusers, and bit for bit
    the weights (and output) of the same model loaded from its diffusers folder."""
    inputs = klein["inputs"]
    got = np.asarray(ditax.load_transformer(str(klein["path"]), config=klein["cfg"])(**inputs))
    want = run_diffusers_flux2(klein["m"], inputs)
    folder = np.asarray(ditax.load_transformer(klein["folder"])(**inputs))
    err = rel_err(got, want)
    print("flux2 BFL file vs diffusers", f"{err:.1e}",
          "vs folder", float(np.abs(got - folder).max()))
    assert err <= 1e-5, err
    assert np.array_equal(got, folder)


def test_loras_on_a_bfl_file_equal_the_folder(klein, tmp_path):
    """A BFL-named LoRA on the fused double-block qkv (ai-toolkit / ComfyUI keys) and one on
    the single block's linear1, merged into the BFL file as it is read, give what they give
    the diffusers folder."""
    from safetensors.numpy import save_file

    rng, d = np.random.default_rng(1), 32
    m = KLEIN["mlp_ratio"]
    lora = {}
    for name, rows in (("double_blocks.1.img_attn.qkv", 3 * d),
                       ("single_blocks.0.linear1", int(3 * d + 2 * m * d))):
        lora[f"diffusion_model.{name}.lora_A.weight"] = rng.standard_normal((2, d))
        lora[f"diffusion_model.{name}.lora_B.weight"] = 0.1 * rng.standard_normal((rows, 2))
    save_file({k: v.astype(np.float32) for k, v in lora.items()}, str(tmp_path / "l.safetensors"))
    loras = [(tmp_path / "l.safetensors", 0.8)]
    inputs = klein["inputs"]
    got = np.asarray(ditax.load_transformer(str(klein["path"]), config=klein["cfg"],
                                            loras=loras)(**inputs))
    want = np.asarray(ditax.load_transformer(klein["folder"], loras=loras)(**inputs))
    plain = run_diffusers_flux2(klein["m"], inputs)
    assert np.array_equal(got, want) and rel_err(want, plain) > 1e-2


def test_convert_writes_a_folder_that_loads_equal(klein, tmp_path, capsys):
    """``ditax convert FILE --config YAML`` (check) and ``--out DIR``: the folder holds
    diffusers' own tensors bit for bit and a config.json that diffusers reads; a ComfyUI-
    prefixed copy and a file under diffusers' names check too."""
    from diffusers import Flux2Transformer2DModel
    from safetensors.numpy import load_file, save_file

    path, spec = str(klein["path"]), str(klein["spec"])
    assert main(["convert", path, "--config", spec]) == 0
    assert "OK — 2 double + 2 single blocks" in capsys.readouterr().out
    out = tmp_path / "out"
    assert main(["convert", path, "--config", spec, "--out", str(out)]) == 0
    got = load_file(str(out / "diffusion_pytorch_model.safetensors"))
    assert sorted(got) == sorted(klein["sd"])
    for k, v in klein["sd"].items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)
    assert Flux2Transformer2DModel.from_pretrained(out).config.out_channels == 6
    inputs = klein["inputs"]
    assert np.array_equal(np.asarray(ditax.load_transformer(out)(**inputs)),
                          np.asarray(ditax.load_transformer(klein["folder"])(**inputs)))
    for name, tensors in (("comfy", {COMFY + k: v for k, v in klein["tensors"].items()}),
                          ("diffusers", klein["sd"])):
        save_file(tensors, str(tmp_path / f"{name}.safetensors"))
        assert main(["convert", str(tmp_path / f"{name}.safetensors"), "--config", spec]) == 0


def test_convert_quantize_int8(klein, tmp_path, capsys):
    """``ditax convert FILE --config YAML --quantize int8 --out DIR`` writes what the same
    command writes from the diffusers folder, bit for bit."""
    from safetensors.numpy import load_file

    a, b = tmp_path / "from_file", tmp_path / "from_folder"
    assert main(["convert", str(klein["path"]), "--config", str(klein["spec"]), "--quantize",
                 "int8", "--out", str(a)]) == 0
    assert main(["convert", str(klein["folder"]), "--quantize", "int8", "--out", str(b)]) == 0
    assert "OK" in capsys.readouterr().out
    got = {k: v for f in sorted(a.glob("*.safetensors")) for k, v in load_file(str(f)).items()}
    want = {k: v for f in sorted(b.glob("*.safetensors")) for k, v in load_file(str(f)).items()}
    assert sorted(got) == sorted(want)
    assert any(v.dtype == np.int8 for v in got.values())
    for k, v in want.items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)


def _one_line(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_files_that_do_not_fit(klein, tmp_path, capsys):
    """An unknown key, a missing key, a wrongly shaped key: one line naming the key and the
    fix (headers only: nothing is built or read); a FLUX.1 file is named as one; the
    full-size preset names the shapes."""
    from safetensors.numpy import save_file

    tensors, cfg, spec = klein["tensors"], klein["cfg"], str(klein["spec"])
    fix = "check config= (the file's model: flux.2-dev has the guidance embedding"
    unknown = dict(tensors, **{"double_blocks.0.img_attn.lora.weight": np.zeros(3, np.float32)})
    missing = {k: v for k, v in tensors.items() if k != "single_blocks.1.linear2.weight"}
    short = dict(tensors, **{"single_blocks.0.linear1.weight":
                             tensors["single_blocks.0.linear1.weight"][:-2]})
    cases = ((unknown, "unexpected 1 key(s): double_blocks.0.img_attn.lora.weight"),
             (missing, "missing 1 key(s): single_blocks.1.linear2.weight"),
             (short, "single_blocks.0.linear1.weight: shape (222, 32) but the model expects "
                     "(224, 32)"))
    for i, (bad, words) in enumerate(cases):
        path = tmp_path / f"bad{i}.safetensors"
        save_file(bad, str(path))
        with pytest.raises(WeightError) as e:
            ditax.load_transformer(str(path), config=cfg)
        assert "\n" not in str(e.value) and words in str(e.value) and fix in str(e.value)
        line = _one_line(capsys, ["convert", str(path), "--config", spec])
        assert words in line and fix in line, line
    # dev's architecture (a guidance embedding) on a klein file: the guidance keys are missing
    with pytest.raises(WeightError, match="missing 2 key.*guidance_in"):
        ditax.load_transformer(str(klein["path"]),
                               config=dataclasses.replace(cfg, guidance_embeds=True))
    flux1 = dict(tensors, **{"vector_in.in_layer.weight": np.zeros((32, 8), np.float32)})
    save_file(flux1, str(tmp_path / "flux1.safetensors"))
    assert "FLUX.1 checkpoint" in _one_line(
        capsys, ["convert", str(tmp_path / "flux1.safetensors"), "--config", spec])
    line = _one_line(capsys, ["convert", str(klein["path"]), "--config", "flux.2-klein-4b"])
    assert "img_in.weight: shape (32, 8) but the model expects (3072, 128)" in line, line


def test_sliced_reads_of_fused_rows(klein):
    """A sharded load reads row ranges: every range of every diffusers tensor (q / k / v of
    the fused qkv, the final modulation's swapped halves, a range across both) equals the
    whole tensor's, and the whole tensors are diffusers' own."""
    from flax import nnx

    from ditax.io.convert import param_shapes
    from ditax.models.flux2.build import abstract_model
    from ditax.models.flux2.convert import weight_table
    from ditax.models.flux2.single_file import BflWeights, open_single_file

    cfg = klein["cfg"]
    view = open_single_file(klein["path"], cfg, weight_table(cfg),
                            param_shapes(nnx.state(abstract_model(cfg))))
    assert isinstance(view, BflWeights) and sorted(view.keys()) == sorted(klein["sd"])
    rng = np.random.default_rng(0)
    for key in view.keys():
        whole = view.get(key)
        np.testing.assert_array_equal(whole, klein["sd"][key], err_msg=key)
        n = whole.shape[0]
        for a, b in [(0, n), (n // 4, 3 * n // 4), (0, 0)] + [
                tuple(sorted(rng.integers(0, n + 1, 2))) for _ in range(2)]:
            cols = (slice(1, 3),) if whole.ndim == 2 else ()
            np.testing.assert_array_equal(view.read(key, (slice(a, b),) + cols),
                                          whole[(slice(a, b),) + cols], err_msg=key)
