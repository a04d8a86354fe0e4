"""BFL single-file FLUX.1 checkpoints: a tiny random diffusers ``FluxTransformer2DModel`` written
under BFL's names (the inverse of diffusers' ``convert_flux_transformer_checkpoint_to_diffusers``,
written out here from its facts), loaded by ``ditax.load_transformer(file, config=...)``, equal
to diffusers' output; files that do not fit give one error naming every bad key."""

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

import ditax  # noqa: E402
from ditax.cli import main  # noqa: E402
from ditax.errors import WeightError  # noqa: E402
from ditax.models.flux.config import FluxConfig  # noqa: E402
from flux_reference import DEV, flux_inputs, make_diffusers_flux, run_diffusers_flux  # noqa: E402
from wan_reference import rel_err  # noqa: E402


def to_bfl(sd: dict, num_layers: int, num_single: int, prefix: str = "") -> dict:
    """diffusers state dict (numpy) → BFL's keys: q/k/v fused, linear1 = q, k, v, MLP,
    RMSNorm gains as ``.scale``, the final modulation's halves back in BFL's shift, scale."""
    sd, out = dict(sd), {}

    def put(bfl, *keys, swap=False):
        for suffix in (".weight", ".bias"):
            parts = [sd.pop(k + suffix) for k in keys if k + suffix in sd]
            if parts:
                w = np.concatenate(parts, 0)
                if swap:
                    w = np.concatenate(np.split(w, 2, 0)[::-1], 0)
                out[prefix + bfl + suffix] = w

    def norm(bfl, key):
        out[prefix + bfl + ".scale"] = sd.pop(key + ".weight")

    for ours, theirs in (("img_in", "x_embedder"), ("txt_in", "context_embedder"),
                         ("final_layer.linear", "proj_out")):
        put(ours, theirs)
    for ours, theirs in (("time_in", "timestep_embedder"), ("vector_in", "text_embedder"),
                         ("guidance_in", "guidance_embedder")):
        put(f"{ours}.in_layer", f"time_text_embed.{theirs}.linear_1")
        put(f"{ours}.out_layer", f"time_text_embed.{theirs}.linear_2")
    put("final_layer.adaLN_modulation.1", "norm_out.linear", swap=True)
    for i in range(num_layers):
        b, t = f"double_blocks.{i}", f"transformer_blocks.{i}"
        put(f"{b}.img_mod.lin", f"{t}.norm1.linear")
        put(f"{b}.txt_mod.lin", f"{t}.norm1_context.linear")
        put(f"{b}.img_attn.qkv", *(f"{t}.attn.to_{c}" for c in "qkv"))
        put(f"{b}.txt_attn.qkv", *(f"{t}.attn.add_{c}_proj" for c in "qkv"))
        put(f"{b}.img_attn.proj", f"{t}.attn.to_out.0")
        put(f"{b}.txt_attn.proj", f"{t}.attn.to_add_out")
        for s, d in (("img", ""), ("txt", "_context")):
            put(f"{b}.{s}_mlp.0", f"{t}.ff{d}.net.0.proj")
            put(f"{b}.{s}_mlp.2", f"{t}.ff{d}.net.2")
        norm(f"{b}.img_attn.norm.query_norm", f"{t}.attn.norm_q")
        norm(f"{b}.img_attn.norm.key_norm", f"{t}.attn.norm_k")
        norm(f"{b}.txt_attn.norm.query_norm", f"{t}.attn.norm_added_q")
        norm(f"{b}.txt_attn.norm.key_norm", f"{t}.attn.norm_added_k")
    for i in range(num_single):
        b, t = f"single_blocks.{i}", f"single_transformer_blocks.{i}"
        put(f"{b}.modulation.lin", f"{t}.norm.linear")
        put(f"{b}.linear1", *(f"{t}.attn.to_{c}" for c in "qkv"), f"{t}.proj_mlp")
        put(f"{b}.linear2", f"{t}.proj_out")
        norm(f"{b}.norm.query_norm", f"{t}.attn.norm_q")
        norm(f"{b}.norm.key_norm", f"{t}.attn.norm_k")
    assert not sd, sorted(sd)        # every diffusers tensor has a BFL home
    return out


@pytest.fixture(scope="module")
def bfl(tmp_path_factory):
    from safetensors.numpy import save_file

    tmp = tmp_path_factory.mktemp("bfl")
    m, folder = make_diffusers_flux(tmp, seed=3, **DEV)
    sd = {k: v.detach().numpy() for k, v in m.state_dict().items()}
    tensors = to_bfl(sd, DEV["num_layers"], DEV["num_single_layers"], "model.diffusion_model.")
    path = tmp / "flux1-tiny.safetensors"
    save_file(tensors, str(path))
    cfg = FluxConfig.from_diffusers(dict(DEV))
    inputs = flux_inputs(np.random.default_rng(0), DEV, text=5, guidance=True)
    return m, path, tensors, cfg, inputs, folder


def test_bfl_file_equals_diffusers(bfl):
    m, path, _, cfg, inputs = bfl[:5]
    tr = ditax.load_transformer(str(path), config=cfg)
    got = np.asarray(tr(**inputs))
    want = run_diffusers_flux(m, inputs)
    assert rel_err(got, want) <= 1e-5, rel_err(got, want)


def test_loras_on_a_bfl_file_equal_the_folder(bfl, tmp_path):
    """LoRAs merged into a BFL file as it is read (kohya's fused qkv, PEFT's proj_mlp) give the
    weights the same LoRAs give the diffusers folder of that model."""
    from safetensors.numpy import save_file

    _, path, _, cfg, inputs = bfl[:5]
    rng, d = np.random.default_rng(1), 32
    lora = {"lora_unet_double_blocks_1_img_attn_qkv.lora_down.weight": rng.standard_normal(
                (2, d)), "lora_unet_double_blocks_1_img_attn_qkv.lora_up.weight":
            0.1 * rng.standard_normal((3 * d, 2))}
    save_file({k: v.astype(np.float32) for k, v in lora.items()}, str(tmp_path / "k.safetensors"))
    peft = {f"transformer.single_transformer_blocks.0.proj_mlp.lora_{s}.weight": v
            for s, v in (("A", rng.standard_normal((2, d))),
                         ("B", 0.1 * rng.standard_normal((4 * d, 2))))}
    save_file({k: v.astype(np.float32) for k, v in peft.items()}, str(tmp_path / "p.safetensors"))
    loras = [(tmp_path / "k.safetensors", 0.7), (tmp_path / "p.safetensors", 1.2)]
    got = np.asarray(ditax.load_transformer(str(path), config=cfg, loras=loras)(**inputs))
    want = np.asarray(ditax.load_transformer(bfl[5], loras=loras)(**inputs))
    plain = np.asarray(ditax.load_transformer(bfl[5])(**inputs))
    assert rel_err(got, want) <= 1e-6 and rel_err(want, plain) > 1e-2


def test_files_that_do_not_fit(bfl, tmp_path, capsys):
    from safetensors.numpy import save_file

    _, path, tensors, cfg, _ = bfl[:5]
    p = "model.diffusion_model."
    bad = dict(tensors)
    del bad[p + "double_blocks.1.txt_attn.qkv.weight"]
    bad[p + "single_blocks.0.linear1.weight"] = bad[p + "single_blocks.0.linear1.weight"][:-2]
    bad[p + "double_blocks.0.img_attn.lora.weight"] = np.zeros(3, np.float32)
    save_file(bad, str(tmp_path / "bad.safetensors"))
    with pytest.raises(WeightError) as e:
        ditax.load_transformer(str(tmp_path / "bad.safetensors"), config=cfg)
    msg = str(e.value)
    assert "\n" not in msg
    for key in ("missing 1 key(s): model.diffusion_model.double_blocks.1.txt_attn.qkv.weight",
                "unexpected 1 key(s): model.diffusion_model.double_blocks.0.img_attn.lora.weight",
                "single_blocks.0.linear1.weight: shape (222, 32) but the model expects (224, 32)"):
        assert key in msg, msg
    # schnell's architecture (no guidance embedding) on a dev file: the guidance keys are extra
    with pytest.raises(WeightError, match="unexpected 4 key.*guidance_in"):
        ditax.load_transformer(str(path), config=dataclasses.replace(cfg, guidance_embeds=False))
    # a preset of the full-size model: the shapes name the file's keys (headers only, CLI exit 2)
    assert main(["convert", str(path), "--config", "flux.1-dev"]) == 2
    assert "img_in.weight: shape (32, 8) but the model expects (3072, 64)" in \
        capsys.readouterr().err


def test_convert_writes_a_diffusers_folder(bfl, tmp_path, capsys):
    """``ditax convert FILE --config YAML --out DIR``: the folder holds diffusers' own tensors
    (bit for bit) and a config.json that FluxTransformer2DModel reads."""
    import yaml
    from diffusers import FluxTransformer2DModel
    from safetensors.numpy import load_file

    m, path, _, _, _ = bfl[:5]
    spec = tmp_path / "tiny.yaml"
    spec.write_text(yaml.safe_dump({"name": "tiny-bfl", "model": dict(DEV, family="flux")}))
    out = tmp_path / "out"
    assert main(["convert", str(path), "--config", str(spec)]) == 0
    assert "OK — 2 double + 2 single blocks" in capsys.readouterr().out
    assert main(["convert", str(path), "--config", str(spec), "--out", str(out)]) == 0
    got = load_file(str(out / "diffusion_pytorch_model.safetensors"))
    want = {k: v.detach().numpy() for k, v in m.state_dict().items()}
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)
    assert FluxTransformer2DModel.from_pretrained(out).config.guidance_embeds


def test_sliced_reads_of_fused_rows(bfl):
    """A sharded load reads row ranges: every range of every diffusers tensor (fused members,
    the swapped modulation's halves, a range across both halves) equals the whole tensor's."""
    from flax import nnx

    from ditax.io.convert import param_shapes
    from ditax.models.flux.build import abstract_model
    from ditax.models.flux.convert import weight_table
    from ditax.models.flux.single_file import BflWeights, open_single_file

    _, path, _, cfg, _ = bfl[:5]
    view = open_single_file(path, cfg, weight_table(cfg),
                            param_shapes(nnx.state(abstract_model(cfg))))
    assert isinstance(view, BflWeights)
    rng = np.random.default_rng(0)
    for key in view.keys():
        whole = view.get(key)
        if not whole.ndim:
            continue
        n = whole.shape[0]
        for a, b in [(0, n), (n // 4, 3 * n // 4), (0, 0)] + [
                tuple(sorted(rng.integers(0, n + 1, 2))) for _ in range(3)]:
            cols = (slice(1, 3),) if whole.ndim == 2 else ()
            np.testing.assert_array_equal(view.read(key, (slice(a, b),) + cols),
                                          whole[(slice(a, b),) + cols], err_msg=key)
