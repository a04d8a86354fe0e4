"""fp8 mode lowered for CUDA on this CPU machine: the 8-bit dots of a quantized Wan.

A tiny abstract Wan transformer (no weights: shapes only) quantized as the loader does
(:func:`ditax.nn.quant.quantize_module`) for an H200 — a stand-in device with the platform and
``device_kind`` jax reports there, the only inputs of :func:`~ditax.nn.quant.native_dots` —
is traced and lowered with ``lowering_platforms=("cuda",)`` (``tests/refs/cuda_probes.py``;
nothing compiles). fp8 weights x fp8 activations: every block linear's dot is ``f8E4M3FN x
f8E4M3FN -> f32`` in the StableHLO (the GEMMs cuBLASLt runs in fp8 on Hopper); fp8 weights
only: the kernels arrive in fp8 but every dot is in the compute dtype (memory only). What this
does not show: that XLA's CUDA compiler keeps them fp8, or their speed
(``benchmarks/gpu_check.py`` on a GPU).
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import jax
import jax.numpy as jnp
from flax import nnx

import cuda_probes
from ditax.models.wan.build import abstract_model
from ditax.models.wan.config import WanConfig
from ditax.nn.quant import quantize_module, quantized_linears

H200 = SimpleNamespace(platform="gpu", device_kind="NVIDIA H200")
CFG = WanConfig(num_attention_heads=2, attention_head_dim=32, ffn_dim=128, num_layers=2,
                text_dim=64, freq_dim=64, in_channels=16, out_channels=16)
ARGS = [jax.ShapeDtypeStruct(s, d) for s, d in (((1, 16, 2, 8, 8), jnp.float32),
                                                ((1,), jnp.float32),
                                                ((1, 16, 64), jnp.float32))]
DOT = re.compile(r"stablehlo\.dot_general .*: \((tensor<[^>]*>), (tensor<[^>]*>)\) -> "
                 r"(tensor<[^>]*>)")


def lowered(mode: str, activations: bool) -> tuple[str, int]:
    """The StableHLO of the quantized model's forward for an H200, and its number of
    quantized block linears (each traced once: the blocks are one scanned body)."""
    model = quantize_module(abstract_model(CFG), mode, activations, [H200])
    linears = len(list(quantized_linears(model, [n for n, _ in model.block_stacks])))
    gdef, state = nnx.split(model)
    state = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), state)
    with cuda_probes.h200():
        text = cuda_probes.cuda_hlo(
            lambda s, x, t, c: nnx.merge(gdef, s)(x, t, c, None, None), state, *ARGS)
    return text, linears


def dots(text: str) -> list[tuple[str, str, str]]:
    return DOT.findall(text)


def test_fp8_weights_and_activations_lower_to_fp8_gemms_for_h200():
    text, linears = lowered("fp8", True)
    f8 = [d for d in dots(text) if d[0].endswith("xf8E4M3FN>") and d[1].endswith("xf8E4M3FN>")]
    assert linears == 10 and len(f8) == linears, (linears, len(f8))
    assert all(d[2].endswith("xf32>") for d in f8)        # fp32 accumulation, then the scales


def test_fp8_weights_only_keep_fp8_storage_and_compute_dtype_dots():
    text, linears = lowered("fp8", False)
    main = next(ln for ln in text.splitlines() if "func.func public @main" in ln)
    assert main.count("xf8E4M3FN>") >= linears             # the kernels arrive in fp8
    assert not [d for d in dots(text) if "f8E4M3FN" in d[0] + d[1]]
