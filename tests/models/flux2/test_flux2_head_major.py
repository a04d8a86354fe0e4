"""FLUX.2's double blocks in the head-major layout (a TPU kernel's ``[B, N, S', K]``: the
q / k / v kernels stored ``[N, D, K]`` write it from their dots, the per-head norms and RoPE
run in it, image and text are joined on its token axis, ``to_out`` / ``to_add_out`` contract
the kernel's output where it lies) against diffusers, forward and gradient (parameters in
diffusers' keys and layouts), in int8 against the token-major path, and with an unmerged
LoRA."""

import numpy as np
import pytest

import ditax
from ditax.config import AttentionConfig
from ditax.models.flux2.blocks import Attention
from flux2_reference import TINY, errors_vs_diffusers, flux2_inputs, make_diffusers_flux2
from wan_reference import rel_err

SPLASH = AttentionConfig(backend="splash")


def spy(monkeypatch):
    """The ``head_major`` flags the double blocks' q / k / v were traced with."""
    seen, qkv = [], Attention.qkv

    def wrapped(self, x, sharding, added, head_major=False):
        seen.append(head_major)
        return qkv(self, x, sharding, added, head_major)

    monkeypatch.setattr(Attention, "qkv", wrapped)
    return seen


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_diffusers_flux2(tmp_path_factory.mktemp("flux2hm"), **TINY)


def test_head_major_double_blocks_match_diffusers(tiny, rng, fast_compile, monkeypatch):
    """splash (interpret mode on CPU) reads head-major, so the double blocks take that path;
    output and gradients (inputs, every parameter) within the token-major test's 1e-5."""
    m, folder = tiny
    inputs = flux2_inputs(rng, TINY, b=1)
    tr = ditax.load_transformer(folder, attention=SPLASH)
    calls = spy(monkeypatch)
    errs = errors_vs_diffusers(m, tr, inputs, rng)
    assert calls and all(calls)                # traced: the double blocks took the path
    assert max(errs.values()) <= 1e-5, errs


@pytest.mark.parametrize("acts", [False, True], ids=["w8", "w8a8"])
def test_head_major_int8_matches_token_major(tiny, rng, acts, monkeypatch):
    """int8 weights (and activations): the head-major double blocks (8-bit ``[N, D, K]``
    kernels, their per-channel scales) give the token-major path's output."""
    _, folder = tiny
    inputs = flux2_inputs(rng, TINY, b=1)
    calls = spy(monkeypatch)
    kw = dict(quantize="int8", quantize_activations=acts)
    outs = [np.asarray(ditax.load_transformer(folder, attention=a, **kw)(**inputs))
            for a in ("xla", SPLASH)]
    assert True in calls and False in calls
    assert rel_err(outs[1], outs[0]) < 1e-5, rel_err(outs[1], outs[0])


def test_head_major_unmerged_lora_matches_merged(tiny, tmp_path, rng):
    """A LoRA on a double block's ``to_q`` / ``add_v_proj`` (head-major ``[N, D, K]``
    kernels) and ``to_out``, unmerged, through the head-major path
    (:class:`~ditax.lora.unmerged.LoraLinear`'s ``to_head_major`` / ``from_head_major``):
    the merged token-major model's output."""
    from safetensors.numpy import save_file

    _, folder = tiny
    d, r = 32, 4
    mods = {"transformer_blocks.0.attn.to_q": (d, d),
            "transformer_blocks.1.attn.add_v_proj": (d, d),
            "transformer_blocks.1.attn.to_out.0": (d, d)}
    peft = {}
    for name, (din, dout) in mods.items():
        peft[f"transformer.{name}.lora_A.weight"] = (
            0.1 * rng.standard_normal((r, din))).astype(np.float32)
        peft[f"transformer.{name}.lora_B.weight"] = (
            0.1 * rng.standard_normal((dout, r))).astype(np.float32)
    save_file(peft, str(tmp_path / "peft.safetensors"))
    loras = [(tmp_path / "peft.safetensors", 0.7)]
    inputs = flux2_inputs(rng, TINY, b=1)
    merged = np.asarray(ditax.load_transformer(folder, loras=loras)(**inputs))
    base = np.asarray(ditax.load_transformer(folder)(**inputs))
    unmerged = np.asarray(ditax.load_transformer(folder, loras=loras, lora_mode="unmerged",
                                                 attention=SPLASH)(**inputs))
    assert rel_err(merged, base) > 1e-3                       # the LoRA changes the output
    assert rel_err(unmerged, merged) < 1e-5, rel_err(unmerged, merged)
