"""Unmerged LoRAs on 8-bit kernels (``quantize='int8'`` with ``lora_mode='unmerged'``).

A tiny random Wan folder (2 heads x 16, 2 layers; ditax's own export, no torch) and a rank-4
PEFT LoRA on the self-attention q, the FFN in and out of both blocks. Unmerged on the int8
base, each targeted layer is a ``LoraLinear`` over the very int8 kernel and scales of the plain
int8 model (base dequantized per dot, the LoRA term in float32). Its output equals the merged
-then-quantized model within the quantization error and the float model + LoRA within the int8
bar of tests/models/test_quantized_load.py (2e-2); strength 0 gives the plain int8 model's
output without recompiling. Measured on these weights: vs merged-then-quantized 8.6e-3, vs
float + LoRA 7.9e-3, strength 0 vs plain int8 0 (bound 1e-5).
"""

import jax.numpy as jnp
import numpy as np
import pytest

import ditax
from ditax.lora.unmerged import LoraLinear
from quant_folders import write_wan_folder
from wan_reference import rel_err


@pytest.fixture(scope="module")
def folder_and_lora(tmp_path_factory):
    from lora_reference import block_modules, write_peft

    root = tmp_path_factory.mktemp("uq")
    folder = write_wan_folder(root / "wan")
    gen = np.random.default_rng(7)
    shapes = {"attn1.to_q": (32, 32), "ffn.net.0.proj": (64, 32), "ffn.net.2": (32, 64)}
    lora = {m: dict(down=(0.3 * gen.standard_normal((4, shapes[m.split(".", 2)[2]][1])))
                    .astype(np.float32),
                    up=(0.3 * gen.standard_normal((shapes[m.split(".", 2)[2]][0], 4)))
                    .astype(np.float32), alpha=None, bias=None)
            for m in block_modules(2, tuple(shapes))}
    return folder, write_peft(root / "lora.safetensors", lora)


def _inputs():
    gen = np.random.default_rng(1)
    return (gen.standard_normal((2, 4, 2, 8, 8)).astype(np.float32),
            np.full((2,), 500.0, np.float32), gen.standard_normal((2, 7, 32)).astype(np.float32))


def test_unmerged_lora_on_int8_kernels(folder_and_lora):
    folder, path = folder_and_lora
    x, t, c = _inputs()
    loras = [(path, 0.8)]
    unmerged = ditax.load_transformer(folder, quantize="int8", loras=loras, lora_mode="unmerged")
    plain = ditax.load_transformer(folder, quantize="int8")
    for name in ("attn1.to_q", "ffn.proj_in", "ffn.proj_out"):
        a, b = unmerged.module.blocks, plain.module.blocks
        for part in name.split("."):
            a, b = getattr(a, part), getattr(b, part)
        assert isinstance(a, LoraLinear) and a.kernel[...].dtype == jnp.int8, name
        assert a.lora_down[...].dtype == jnp.float32, name
        np.testing.assert_array_equal(np.asarray(a.kernel[...]), np.asarray(b.kernel[...]))
        np.testing.assert_array_equal(np.asarray(a.kernel_scale[...]),
                                      np.asarray(b.kernel_scale[...]))
    y = np.asarray(unmerged(x, t, c))
    merged_q = np.asarray(ditax.load_transformer(folder, quantize="int8", loras=loras)(x, t, c))
    float_lora = np.asarray(ditax.load_transformer(folder, loras=loras)(x, t, c))
    y_plain = np.asarray(plain(x, t, c))
    e_merged, e_float = rel_err(y, merged_q), rel_err(y, float_lora)
    assert 1e-4 < e_merged < 2e-2, e_merged
    assert 1e-4 < e_float < 2e-2, e_float
    assert rel_err(y, y_plain) > 5e-2            # the LoRA changes the output
    unmerged.set_lora_strengths([0.0])
    e_zero = rel_err(np.asarray(unmerged(x, t, c)), y_plain)
    assert e_zero < 1e-5, e_zero
    print(f"unmerged int8: vs merged-then-quantized {e_merged:.2e}, vs float + LoRA "
          f"{e_float:.2e}, strength 0 vs plain int8 {e_zero:.1e}")
