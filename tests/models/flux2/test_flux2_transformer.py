"""FLUX.2 transformer: parity with diffusers' ``Flux2Transformer2DModel`` (forward and gradient
w.r.t. the inputs and every parameter; scanned under save_proj remat), loaded from
``save_pretrained`` folders; int8 weights; PEFT and BFL LoRAs merged; the presets'
architectures; bad configs, inputs and folders refused in one line before tracing."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import ditax
from ditax.errors import ConfigError, RequestError, WeightError
from ditax.models.flux2.config import Flux2Config, check_transformer
from flux2_reference import (TINY, errors_vs_diffusers, flux2_inputs, make_diffusers_flux2,
                             run_diffusers_flux2)
from wan_reference import rel_err



@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """diffusers' test config (2 + 2 blocks, guidance embedding) saved with save_pretrained."""
    return make_diffusers_flux2(tmp_path_factory.mktemp("flux2"), **TINY)


def test_forward_and_gradient_match_diffusers(tiny, rng, fast_compile):
    """The loaded model's output and its gradient (w.r.t. the inputs and every parameter, in
    diffusers' keys and layouts) against torch autograd, from one compiled program: diffusers'
    test config and 4 x 4 grid, scanned stacks under save_proj remat (the klein-like config
    is compared in test_flux2_parallel.py, unrolled blocks under full remat in
    test_flux2_train.py)."""
    m, folder = tiny
    inputs = flux2_inputs(rng, TINY)
    tr = ditax.load_transformer(folder, remat="save_proj")
    assert type(tr).__name__ == "Flux2TransformerModel"
    errs = errors_vs_diffusers(m, tr, inputs, rng)
    # the largest parameter errors (~7e-6) come from the 1000 x t sinusoid: ditax's float32
    # frequency table is the correctly rounded one, torch's exp is an ulp off in 2 of its 128
    # entries (with torch's table the errors are ~1.5e-6, torch float32 vs float64's level)
    print("flux2 rel err", {k: f"{v:.1e}" for k, v in errs.items()})
    assert max(errs.values()) <= 1e-5, errs


def test_int8_weights_stay_close(tiny, rng):
    """``quantize="int8"`` stores the block linears in 8 bits: the output stays within int8's
    error of the float model (and is not the float model's)."""
    m, folder = tiny
    inputs = flux2_inputs(rng, TINY, b=1)
    ref = run_diffusers_flux2(m, inputs)
    tr = ditax.load_transformer(folder, quantize="int8")
    k = tr.module.single_transformer_blocks.attn.to_qkv_mlp_proj.kernel[...]
    assert k.dtype == jnp.int8
    err = rel_err(tr(**inputs), ref)
    assert 1e-6 < err < 2e-2, err


def test_presets_are_diffusers_architectures():
    """The presets hold the values of diffusers' convert_flux2_to_diffusers.py and pass the
    model rules; their diffusers config.json round-trips."""
    from ditax.config import load_config

    want = {"flux.2-dev": (8, 48, 48, 15360, True), "flux.2-klein-9b": (8, 24, 32, 12288, False),
            "flux.2-klein-4b": (5, 20, 24, 7680, False)}
    for name, (nl, ns, nh, dt, g) in want.items():
        m = load_config(name, []).model
        assert (m.num_layers, m.num_single_layers, m.num_attention_heads,
                m.joint_attention_dim, m.guidance_embeds) == (nl, ns, nh, dt, g), name
        assert (m.in_channels, m.mlp_ratio, m.axes_dims_rope, m.rope_theta) == (
            128, 3.0, (32, 32, 32, 32), 2000.0)
        raw = json.loads(json.dumps(m.to_diffusers()))
        assert Flux2Config.from_diffusers(raw).to_diffusers() == m.to_diffusers()
    assert Flux2Config().inner_dim == 6144 and Flux2Config().mlp_dim == 18432


@pytest.mark.parametrize("field,value,words", [
    ("axes_dims_rope", (4, 4, 4, 2), "sums to 14"),
    ("axes_dims_rope", (4, 4, 5, 3), "even sizes"),
    ("num_single_layers", 0, "num_single_layers=0"),
    ("mlp_ratio", -1.0, "mlp_ratio=-1.0"),
    ("timestep_guidance_channels", 255, "must be even"),
])
def test_bad_config_is_one_line(field, value, words):
    with pytest.raises(ConfigError, match=words.replace("(", r"\(")):
        check_transformer(Flux2Config(**{**{k: v for k, v in TINY.items()
                                            if k != "axes_dims_rope"},
                                         "axes_dims_rope": (4, 4, 4, 4), field: value}))


def test_bad_inputs_and_folders_are_one_line(tiny, tmp_path, rng):
    """Shapes, guidance on a model without it (and none on one with it) and a folder missing
    a tensor are refused before anything compiles, naming what to pass."""
    _, folder = tiny
    tr = ditax.load_transformer(folder)
    good = flux2_inputs(rng, TINY, b=1)
    bad = [(dict(hidden_states=good["hidden_states"][..., :3]), "in_channels=4"),
           (dict(img_ids=good["img_ids"][:, :, :3]), "img_ids must be"),
           (dict(txt_ids=good["txt_ids"][:, :4]), "txt_ids must be"),
           (dict(guidance=None), "guidance=None"),
           (dict(timestep=np.zeros((3,), np.float32)), "timestep must be")]
    for change, words in bad:
        with pytest.raises(RequestError, match=words):
            tr(**{**good, **change})
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((folder / "config.json").read_text())
    from safetensors.numpy import load_file, save_file

    sd = load_file(str(folder / "diffusion_pytorch_model.safetensors"))
    sd.pop("single_transformer_blocks.1.attn.to_out.weight")
    save_file(sd, str(broken / "diffusion_pytorch_model.safetensors"))
    with pytest.raises(WeightError, match="single_transformer_blocks.1.attn.to_out.weight"):
        ditax.load_transformer(broken)
    # ditax convert's folder check (headers only) says the same
    from ditax.models.flux2.family import Flux2Family

    assert "OK — 2 double + 2 single blocks" in Flux2Family.check_folder(folder, None)
    with pytest.raises(WeightError, match="single_transformer_blocks.1.attn.to_out.weight"):
        Flux2Family.check_folder(broken, None)


def test_bench_inputs_fit_the_random_transformer():
    """ditax bench's random transformer takes its random inputs (traced, not compiled):
    tokens of the latent grid, text, timestep, ids, guidance where embedded."""
    from ditax.models.flux2.family import Flux2Family

    for guidance in (True, False):
        cfg = Flux2Config.from_diffusers(dict(TINY, guidance_embeds=guidance))
        fam = Flux2Family(cfg)
        args, kw = fam.random_inputs(2, (1, 3, 5), text_len=7)
        out = jax.eval_shape(lambda a: fam.random_transformer(None)(*a, **kw), args)
        assert out.shape == (2, 15, 4) and (args[-1] is not None) == guidance
    with pytest.raises(ConfigError, match="one frame"):
        fam.random_inputs(1, (2, 4, 4))


def _lora_pair(rng, r, din, dout):
    return (0.1 * rng.standard_normal((r, din))).astype(np.float32), (
        0.1 * rng.standard_normal((dout, r))).astype(np.float32)


def test_peft_and_bfl_loras_merge_as_w_plus_s_ba(tiny, tmp_path, rng):
    """A diffusers / PEFT LoRA file (``transformer.`` keys) loads merged as ``W + s·B·A`` into
    double- and single-block layers (the fused single-block projection included); a BFL / ai-toolkit
    file (fused ``img_attn.qkv``, ``single_blocks.N.linear1``) merges as diffusers' own
    converter (``_convert_non_diffusers_flux2_lora_to_diffusers``) reads it."""
    from diffusers.loaders.lora_conversion_utils import (
        _convert_non_diffusers_flux2_lora_to_diffusers)
    from safetensors.numpy import load_file, save_file

    _, folder = tiny
    base = load_file(str(folder / "diffusion_pytorch_model.safetensors"))
    d, m2 = 32, 2 * 96
    r, s = 4, 0.7
    mods = {"transformer_blocks.1.attn.to_q": (d, d),
            "transformer_blocks.0.ff_context.linear_in": (d, m2),
            "single_transformer_blocks.0.attn.to_qkv_mlp_proj": (d, 3 * d + m2)}
    peft, pairs = {}, {}
    for name, (din, dout) in mods.items():
        a, b = pairs[name] = _lora_pair(rng, r, din, dout)
        peft[f"transformer.{name}.lora_A.weight"], peft[f"transformer.{name}.lora_B.weight"] = a, b
    save_file(peft, str(tmp_path / "peft.safetensors"))
    tr = ditax.load_transformer(folder, loras=[(tmp_path / "peft.safetensors", s)])

    def kernel(name, tr):
        stack, i, *rest = name.split(".")
        node = getattr(tr.module, stack)
        for p in rest:
            node = getattr(node, {"0": "to_out"}.get(p, p))
        k = np.asarray(node.kernel[...][int(i)])
        if node.out_heads:                          # head-major [N, D, K] -> [D, N·K]
            k = np.swapaxes(k, 0, 1).reshape(k.shape[1], -1)
        return k

    for name, (a, b) in pairs.items():
        want = base[name + ".weight"] + s * b @ a
        np.testing.assert_allclose(kernel(name, tr), want.T, rtol=1e-5, atol=1e-6)

    a, b = _lora_pair(rng, r, d, 3 * d)
    a1, b1 = _lora_pair(rng, r, d, 3 * d + m2)
    bfl = {"diffusion_model.double_blocks.0.img_attn.qkv.lora_A.weight": a,
           "diffusion_model.double_blocks.0.img_attn.qkv.lora_B.weight": b,
           "diffusion_model.single_blocks.1.linear1.lora_A.weight": a1,
           "diffusion_model.single_blocks.1.linear1.lora_B.weight": b1}
    save_file(bfl, str(tmp_path / "bfl.safetensors"))
    theirs = _convert_non_diffusers_flux2_lora_to_diffusers(
        {k: torch.from_numpy(v) for k, v in bfl.items()})
    save_file({k: v.numpy() for k, v in theirs.items()}, str(tmp_path / "theirs.safetensors"))
    got = ditax.load_transformer(folder, loras=[(tmp_path / "bfl.safetensors", s)])
    want = ditax.load_transformer(folder, loras=[(tmp_path / "theirs.safetensors", s)])
    names = ["transformer_blocks.0.attn.to_q", "transformer_blocks.0.attn.to_v",
             "single_transformer_blocks.1.attn.to_qkv_mlp_proj"]
    for n in names:
        g = kernel(n, got)
        np.testing.assert_allclose(g, kernel(n, want), rtol=1e-6, atol=1e-7, err_msg=n)
        assert np.abs(g - base[n + ".weight"].T).max() > 1e-3, n      # the LoRA is in it


def test_int8_activations_join_the_single_blocks_parts(tiny, rng, monkeypatch):
    """int8 weights x int8 activations: each single block's ``to_out`` reads the attention
    output and the SwiGLU quantized part by part (:meth:`QuantSpec.quantize_parts`, its
    parts' dot traced once a block), and the output is bit for bit that of the concatenation
    quantized whole (the slow reference: ``joined_input`` patched back to the plain
    concatenation, whose dot quantizes it)."""
    from quant_parts_reference import parts_output_equals_joined

    m, folder = tiny
    inputs = flux2_inputs(rng, TINY, b=1)
    tr = ditax.load_transformer(folder, quantize="int8", quantize_activations=True)
    new = parts_output_equals_joined(monkeypatch, tr, inputs)
    assert 1e-6 < rel_err(new, run_diffusers_flux2(m, inputs)) < 5e-2
