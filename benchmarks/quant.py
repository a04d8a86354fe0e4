"""8-bit benchmarks: one JSON object per line.

    {"bench": "quant", "case": ..., "metric": ..., "value": ..., "unit": ..., ...}

``--attention`` (CPU, a few minutes): the 8-bit attention's relative error (Frobenius) against
float32 attention on the same values — ``sage_xla`` (the same quantization and arithmetic as
the ``sage`` kernel, bit for bit in the tests) on bf16 q/k/v at L = 32,760, K = 128 (Wan 2.1
1.3B 480p self-attention), DiT-like statistics (K with a per-channel offset; score std 1, 2,
3), float32 reference from ``blockwise`` (no ``[L, L]`` scores), and for comparison the error
of plain bf16 attention (``blockwise`` in bf16).

``--tpu-hlo`` (needs libtpu; deviceless v6e): the ``sage`` kernel compiled at the same shape
with N = 12 heads: the Mosaic custom calls, their int8 operands, the kernel's matmuls (from
the Mosaic module: ``i8 × i8 → i32`` for ``Q·Kᵀ``, bf16 for ``P·V``), the attention FLOPs
split into int8 and bf16 halves, XLA's temp bytes (the quantization pre-pass) — against
``flash``'s compile at the same shape. No speed: CPU interpret timing says nothing of a TPU.

``--weights``: the transformer weight bytes per mode (bf16, int8, fp8 block linears) of Wan 2.1
14B, Wan 2.2 A14B (both experts) and FLUX.1-dev from their abstract models (no weights).
``--weights-error`` (CPU, a minute): a random 1.3B-width Wan transformer's output relative
error per mode (int8 / fp8 weights, with and without 8-bit activations) against float32.
``--tpu-linears`` (needs libtpu): a 1.3B-width Wan compiled deviceless for v6e per mode —
argument / temp bytes and the dots XLA emits (s32 results of s8 x s8 = native int8).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np


def emit(case, metric, value, unit, **extra):
    print(json.dumps({"bench": "quant", "case": case, "metric": metric, "value": value,
                      "unit": unit, **extra}), flush=True)


def realistic(seed, L, N, K, score_std):
    """bf16 q/k/v ``[1, L, N, K]``: scores of std ``score_std``, K and V with a per-channel
    offset shared by every token (as in trained DiTs, what K smoothing removes)."""
    g = np.random.default_rng(seed)
    q = score_std * g.standard_normal((1, L, N, K), np.float32)
    k = g.standard_normal((1, L, N, K), np.float32) + 3 * g.standard_normal((1, 1, N, K))
    v = g.standard_normal((1, L, N, K), np.float32) + g.standard_normal((1, 1, N, K))
    return tuple(jnp.asarray(x, jnp.bfloat16) for x in (q, k, v))


def attention_error(L: int, N: int, K: int, stds) -> None:
    from ditax.attention.blockwise import blockwise_attention
    from ditax.attention.sage import sage_xla_attention

    jax.config.update("jax_default_matmul_precision", "highest")
    exact = jax.jit(lambda q, k, v: blockwise_attention(
        q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32), block_kv=1024))
    bf16 = jax.jit(lambda q, k, v: blockwise_attention(q, k, v, block_kv=1024))
    sage = jax.jit(lambda q, k, v: sage_xla_attention(q, k, v, block_q=128, block_kv=128))

    def rel(o, ref):
        o = np.asarray(o, np.float32)
        return float(np.linalg.norm(o - ref) / np.linalg.norm(ref))

    for std in stds:
        q, k, v = realistic(0, L, N, K, std)
        ref = np.asarray(exact(q, k, v))
        case = f"L{L}_N{N}_K{K}_score_std{std:g}"
        emit(case, "sage_rel_err_vs_f32", rel(sage(q, k, v), ref), "ratio", target=1e-2,
             inputs="bfloat16", blocks="q128/kv128")
        emit(case, "bf16_attention_rel_err_vs_f32", rel(bf16(q, k, v), ref), "ratio")


def tpu_hlo(L: int, N: int, K: int) -> None:
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies

    import ditax
    from ditax.attention.flash import flash_attention
    from ditax.attention.kernels.mosaic import captured_mosaic_modules
    from ditax.attention.sage import sage_attention

    dev = topologies.get_topology_desc(platform="tpu", topology_name="v6e:2x4").devices[0]
    rep = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array([dev]), ("x",)),
                                     jax.sharding.PartitionSpec())
    x = jax.ShapeDtypeStruct((1, N, L, K), jnp.bfloat16, sharding=rep)
    flops = 4 * N * L * L * K
    for name, fn in (("sage", sage_attention), ("flash", flash_attention)):
        with ditax.target_platform("tpu"), captured_mosaic_modules() as modules:
            compiled = jax.jit(lambda q, k, v: fn(q, k, v, head_major=True, block_q=512,
                                                  block_kv=512)).lower(x, x, x).compile()
        hlo = compiled.as_text()
        calls = [ln for ln in hlo.splitlines() if 'custom_call_target="tpu_custom_call"' in ln]
        matmuls = sorted({ln.split(":")[-1].strip() for m in modules for ln in m.splitlines()
                          if "tpu.matmul" in ln})
        mem = compiled.memory_analysis()
        case = f"v6e_L{L}_N{N}_K{K}_{name}"
        emit(case, "mosaic_calls", len(calls), "count")
        emit(case, "s8_operands", sum(c.split("custom_call_target")[1].count("s8[")
                                      for c in calls), "count")
        emit(case, "kernel_matmuls", matmuls, "mlir types")
        emit(case, "attention_flops", flops, "flop",
             int8_flops=flops // 2 if name == "sage" else 0,
             bf16_flops=flops // 2 if name == "sage" else flops)
        emit(case, "temp_bytes", int(mem.temp_size_in_bytes), "bytes")
        emit(case, "argument_bytes", int(mem.argument_size_in_bytes), "bytes")


MODES = (("int8", False), ("int8", True), ("fp8", False), ("fp8", True))


def weight_memory(presets=("wan2.1-t2v-14b", "wan2.2-t2v-a14b", "flux.1-dev")) -> None:
    """Bytes of the transformer weights per mode, from the abstract model's parameter shapes
    (no weights read): bf16 storage vs 8-bit block linears (+ float32 scales, everything
    else bf16). Wan 2.2 A14B: both experts (two transformers of the same shape)."""
    from flax import nnx

    from ditax.config import load_config
    from ditax.models.base import model_family
    from ditax.nn.quant import quantize_module, weight_bytes

    for name in presets:
        model = load_config(name).model
        experts = 2 if name.startswith("wan2.2") and "a14b" in name else 1
        cfg = dataclasses.replace(model, param_dtype="bfloat16", dtype="bfloat16")
        def build(cfg=cfg):
            return model_family(cfg).abstract(None)

        full = weight_bytes(nnx.state(build())) * experts
        emit(name, "weight_bytes", full, "bytes", mode="bf16", experts=experts,
             gib=round(full / 2**30, 2))
        for mode in ("int8", "fp8"):
            q = weight_bytes(nnx.state(quantize_module(build(), mode))) * experts
            emit(name, "weight_bytes", q, "bytes", mode=mode, experts=experts,
                 gib=round(q / 2**30, 2), vs_bf16=round(q / full, 3))


def weights_error(layers: int = 2, seed: int = 0) -> None:
    """Relative error (Frobenius) of a random Wan transformer of 1.3B width (D = 1536, 12 heads,
    FFN 8960, text 4096; ``layers`` blocks) per mode against its float32 output, on 1 x 16 x 4
    x 16 x 16 latents (L = 256) and 64 text tokens; the block linears quantized from the
    same float32 weights (``quantize_linear``, what the loader computes slice by slice)."""
    from ditax.models.wan.build import init_model
    from ditax.models.wan.config import WanConfig
    from ditax.nn.quant import quantize_linear, quantized_linears

    jax.config.update("jax_default_matmul_precision", "highest")
    cfg = WanConfig(num_attention_heads=12, attention_head_dim=128, ffn_dim=8960,
                    num_layers=layers, text_dim=4096, freq_dim=256)
    g = np.random.default_rng(seed)
    x = jnp.asarray(g.standard_normal((1, 16, 4, 16, 16)), jnp.float32)
    t = jnp.asarray([700.0])
    text = jnp.asarray(g.standard_normal((1, 64, 4096)), jnp.float32)
    run = jax.jit(lambda m, x, t, c: m(x, t, c, None, None))
    ref = np.asarray(run(init_model(cfg, seed=seed), x, t, text))
    for mode, act in MODES:
        m = init_model(cfg, seed=seed)
        for _, lin in list(quantized_linears(m, [n for n, _ in m.block_stacks])):
            quantize_linear(lin, mode, act)
        y = np.asarray(run(m, x, t, text))
        emit(f"wan_D1536_L{layers}", "rel_err_vs_f32",
             float(np.linalg.norm(y - ref) / np.linalg.norm(ref)), "ratio", mode=mode,
             activations=act)


def tpu_linears(layers: int = 2) -> None:
    """Deviceless v6e compile of a bf16 Wan of 1.3B width (``layers`` blocks, 1 x 16 x 4 x 16
    x 16 latents, 64 text tokens) per mode: argument bytes and the dots XLA emits — s32
    results of s8 x s8 operands (native int8) vs bf16 ones (weights widened first)."""
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    import re

    from flax import nnx
    from jax.experimental import topologies

    import ditax
    from ditax.models.wan.build import abstract_model
    from ditax.models.wan.config import WanConfig
    from ditax.nn.quant import describe, quantize_module

    dev = topologies.get_topology_desc(platform="tpu", topology_name="v6e:2x4").devices[0]
    rep = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array([dev]), ("x",)),
                                     jax.sharding.PartitionSpec())
    cfg = WanConfig(num_attention_heads=12, attention_head_dim=128, ffn_dim=8960,
                    num_layers=layers, text_dim=4096, freq_dim=256, param_dtype="bfloat16",
                    dtype="bfloat16")
    args = [jax.ShapeDtypeStruct(s, d, sharding=rep) for s, d in
            (((1, 16, 4, 16, 16), jnp.bfloat16), ((1,), jnp.float32),
             ((1, 64, 4096), jnp.bfloat16))]
    for mode, act in (("none", False),) + MODES:
        m = quantize_module(abstract_model(cfg), mode, act, [dev]) if mode != "none" else (
            abstract_model(cfg))
        gdef, state = nnx.split(m)
        state = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=rep),
                             state)
        with ditax.target_platform("tpu"):
            comp = jax.jit(lambda s, x, t, c: nnx.merge(gdef, s)(x, t, c, None, None)).lower(
                state, *args).compile()
        hlo = comp.as_text()
        dots = {k: len(re.findall(rf"= {k}\[[0-9,]*\]\{{[^}}]*\}} convolution\(", hlo))
                for k in ("s32", "bf16", "f32")}
        emit(f"v6e_wan_D1536_L{layers}", "dots", dots, "count", mode=mode, activations=act,
             argument_bytes=int(comp.memory_analysis().argument_size_in_bytes),
             temp_bytes=int(comp.memory_analysis().temp_size_in_bytes),
             native=describe(mode, act, [dev]))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--attention", action="store_true", help="8-bit attention error (CPU)")
    p.add_argument("--tpu-hlo", action="store_true", help="deviceless v6e compile facts")
    p.add_argument("--L", type=int, default=32760)
    p.add_argument("--heads", type=int, default=1)
    p.add_argument("--K", type=int, default=128)
    p.add_argument("--score-std", type=float, nargs="+", default=[1.0, 2.0, 3.0])
    p.add_argument("--weights", action="store_true",
                   help="weight memory per mode (Wan 2.1 14B, Wan 2.2 A14B, FLUX.1-dev)")
    p.add_argument("--weights-error", action="store_true",
                   help="random 1.3B-width Wan: output relative error per mode (CPU)")
    p.add_argument("--tpu-linears", action="store_true",
                   help="deviceless v6e: the 8-bit dots of a 1.3B-width Wan per mode")
    a = p.parse_args(argv)
    if not (a.attention or a.tpu_hlo or a.weights or a.weights_error or a.tpu_linears):
        p.error("choose --attention, --tpu-hlo, --weights, --weights-error, --tpu-linears")
    if a.tpu_linears:
        tpu_linears()
    if a.weights:
        weight_memory()
    if a.weights_error:
        weights_error()
    if a.attention:
        attention_error(a.L, a.heads, a.K, a.score_std)
    if a.tpu_hlo:
        tpu_hlo(a.L, 12, a.K)


if __name__ == "__main__":
    main()
