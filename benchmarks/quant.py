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
``--weights-error`` (CPU, a few minutes): a random 1.3B-width Wan transformer's and a random
FLUX.1-dev-width Flux's (one double, one single block) output relative error per mode (int8 /
fp8 weights, with and without 8-bit activations) against float32.
``--tpu-linears`` (needs libtpu): a 1.3B-width Wan compiled deviceless for v6e per mode —
argument / temp bytes and the dots XLA emits (s32 results of s8 x s8 = native int8).
``--quality`` (CPU, ~1 s a video; ``benchmarks/quant_quality.py``): the shipped demo model
(``ditax.demo.model_path()``, sampled as ``ditax.demo.SAMPLE``) per mode — full precision, int8
W, int8 W+A, fp8 W, fp8 W+A, 8-bit attention (``sage_xla``: the ``sage`` kernel's numbers), all
together — over the 40 combinations x ``--seeds`` (``--batch`` videos per run of one compiled
step program per mode): the prompt-following score (:mod:`ditax.synthetic.score`) and PSNR /
SSIM of each video against the full-precision (float32) one from the same seed (same noise).
One line per mode and seed, then one summary line per mode (``--out`` also appends them to a
file: docs/quant_quality.jsonl).
``--tpu-14b`` (needs libtpu; minutes per case): the Wan 2.1 14B 720p / 81-frame forward compiled
deviceless for v6e-8 (context 8, ``ulysses``, blocks 512: the ``benchmarks/tpu_aot.py`` case;
``out_a2a=shard_major`` with ``flash``; ``sage`` with ``flat`` and, ``-sm`` cases, ``shard_major``) per mode — bf16 + ``flash``, int8 W+A + ``flash``, bf16 +
``sage``, int8 W+A + ``sage`` — at ``--layers`` layers scaled to 40 as tpu_aot does: argument /
temp bytes, s32 dots (native int8), HBM bytes, and the roofline with the 8-bit FLOPs (the block
linears' with int8 activations, self-attention's Q·Kᵀ with ``sage``) at twice the bf16 rate.
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


def flux_weights_error(double: int = 1, single: int = 1, seed: int = 0) -> None:
    """As :func:`weights_error` for a random Flux of FLUX.1-dev's width (D = 3072, 24 heads,
    MLP 12288, text 4096, guidance embedded; ``double`` + ``single`` blocks, float32) on 256
    image tokens (a 16 x 16 packed grid, ids ``(0, row, col)``) and 64 text tokens, t = 0.7,
    guidance 3.5; the double / single block linears quantized (modulation stays float)."""
    from ditax.models.flux.build import init_model
    from ditax.models.flux.config import FluxConfig
    from ditax.nn.quant import quantize_linear, quantized_linears

    jax.config.update("jax_default_matmul_precision", "highest")
    cfg = FluxConfig(num_layers=double, num_single_layers=single, guidance_embeds=True)
    g = np.random.default_rng(seed)
    rows, cols = np.divmod(np.arange(256), 16)
    x = dict(hidden_states=jnp.asarray(g.standard_normal((1, 256, 64)), jnp.float32),
             encoder_hidden_states=jnp.asarray(g.standard_normal((1, 64, 4096)), jnp.float32),
             pooled_projections=jnp.asarray(g.standard_normal((1, 768)), jnp.float32),
             timestep=jnp.asarray([0.7]), guidance=jnp.asarray([3.5]),
             img_ids=jnp.asarray(np.stack([0 * rows, rows, cols], 1), jnp.float32),
             txt_ids=jnp.zeros((64, 3), jnp.float32))
    run = jax.jit(lambda m, x: m(**x))
    ref = np.asarray(run(init_model(cfg, seed=seed), x))
    for mode, act in MODES:
        m = init_model(cfg, seed=seed)
        for _, lin in list(quantized_linears(m, [n for n, _ in m.block_stacks])):
            quantize_linear(lin, mode, act)
        y = np.asarray(run(m, x))
        del m
        emit(f"flux_D3072_double{double}_single{single}", "rel_err_vs_f32",
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


INT8_WA = ["model.quantize=int8", "model.quantize_activations=true"]
# case: (overrides, local kernel, ulysses out_a2a)
TPU_14B = {"bf16-flash": ([], "flash", "shard_major"),
           "int8wa-flash": (INT8_WA, "flash", "shard_major"),
           "bf16-flash-flat": ([], "flash", "flat"),
           "bf16-sage": ([], "sage", "flat"), "int8wa-sage": (INT8_WA, "sage", "flat"),
           "bf16-sage-sm": ([], "sage", "shard_major"),
           "int8wa-sage-sm": (INT8_WA, "sage", "shard_major")}


def tpu_14b(layers: int, cases, hlo_dir: str = "/tmp") -> None:
    """Wan 2.1 14B 720p on v6e-8 per mode (module docstring): one JSON line per case."""
    import re
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from tpu_aot import FULL_LAYERS, scale

    from ditax.config import load_config
    from ditax.parallel import make_mesh
    from ditax.plan import plan
    from ditax.plan.measure import roofline
    from ditax.plan.targets import parse_target, topology_devices

    target = parse_target("tpu-v6e-8")
    devices = topology_devices(target)
    base = None
    for name in cases:
        over, local, a2a = TPU_14B[name]
        cfg = load_config("wan2.1-t2v-14b", over + [
            "mesh.context=8", "attention.backend=ulysses", f"attention.local={local}",
            f"attention.out_a2a={a2a}", "attention.block_q=512", "attention.block_kv=512",
            f"model.num_layers={layers}"])
        mesh = make_mesh(cfg.mesh, devices)
        hlo = os.path.join(hlo_dir, f"quant_14b_{name}.hlo")
        res = plan(cfg, mesh, compile_=True, chip=target.chip, hlo_path=hlo)
        full = plan(dataclasses.replace(cfg, model=dataclasses.replace(
            cfg.model, num_layers=FULL_LAYERS)), mesh)["param_bytes_per_device"]
        p = scale(res["forward"], layers, 1, (res["param_bytes_per_device"], full))
        # analytic forward FLOPs per device of the 40 layers' dots (one sample, 8 devices)
        f, y, x = p["latent"][2], p["latent"][3] // 2, p["latent"][4] // 2
        L, T, D, M = f * y * x, cfg.sample.max_sequence_length, 5120, 13824
        linear = FULL_LAYERS * (12 * L * D * D + 4 * T * D * D + 4 * L * D * M) / mesh.size
        qk = FULL_LAYERS * 2 * L * L * D / mesh.size
        int8 = (linear if over else 0.0) + (qk if local == "sage" else 0.0)
        r = roofline(p["flops"], p["hbm_bytes"], p["collective_bytes"], target.chip)
        r8 = dict(r, compute_s=(p["flops"] - int8) / target.chip.bf16_flops
                  + int8 / (2 * target.chip.bf16_flops))
        r8["estimate_s"] = max(r8["compute_s"], r8["hbm_s"], r8["ici_s"])
        r8["bound"] = max(("compute_s", "hbm_s", "ici_s"), key=r8.get)[:-2]
        text = open(hlo).read()
        s32 = len(re.findall(r"= s32\[[0-9,]*\]\{[^}]*\} convolution\(", text))
        row = {"bench": "quant", "case": f"v6e8_wan14b_720p_{name}", "metric": "forward",
               "layers_compiled": layers, "argument_bytes": p["argument_bytes"],
               "temp_bytes": p["temp_bytes"], "param_bytes_per_device": full,
               "copy_ops": p["copy_ops"], "copy_bytes": p["copy_bytes"],
               "hbm_bytes": p["hbm_bytes"], "flops": p["flops"], "int8_flops": int8,
               "s32_dots_in_hlo": s32, "tpu_custom_calls": p["tpu_custom_calls"],
               "quantize": res.get("quantize"), "roofline": r, "roofline_8bit": r8}
        if name == "bf16-flash":
            base = r8["estimate_s"]
        row.update(out_a2a=a2a, local=local)
        if base is not None:
            row["vs_bf16_flash"] = round(r8["estimate_s"] / base, 3)
        print(json.dumps(row), flush=True)


def quality(seeds: int, modes, out=None, batch: int = 8) -> None:
    """The demo model per mode (module docstring; benchmarks/quant_quality.py)."""
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from quant_quality import quality as run

    run(seeds, modes, out, batch)


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
                   help="random 1.3B-width Wan and FLUX.1-dev-width Flux: output relative "
                   "error per mode (CPU)")
    p.add_argument("--tpu-linears", action="store_true",
                   help="deviceless v6e: the 8-bit dots of a 1.3B-width Wan per mode")
    p.add_argument("--quality", action="store_true",
                   help="demo model: score and PSNR / SSIM per mode vs full precision (CPU)")
    p.add_argument("--seeds", type=int, default=3, help="--quality: seeds per combination")
    p.add_argument("--modes", nargs="+", default=["int8_w", "int8_wa", "fp8_w", "fp8_wa",
                                                  "sage_attention", "all"],
                   help="--quality: which modes (full precision always runs: the reference)")
    p.add_argument("--batch", type=int, default=8, help="--quality: videos per step program")
    p.add_argument("--out", default=None, help="--quality: also append the lines here")
    p.add_argument("--tpu-14b", action="store_true",
                   help="deviceless v6e-8: Wan 14B 720p forward per mode, 8-bit roofline")
    p.add_argument("--layers", type=int, default=2, help="--tpu-14b: layers compiled")
    p.add_argument("--cases", nargs="+", default=list(TPU_14B), help="--tpu-14b cases")
    a = p.parse_args(argv)
    if not (a.attention or a.tpu_hlo or a.weights or a.weights_error or a.tpu_linears
            or a.quality or a.tpu_14b):
        p.error("choose --attention, --tpu-hlo, --weights, --weights-error, --tpu-linears, "
                "--quality")
    if a.quality:
        quality(a.seeds, a.modes, a.out, a.batch)
    if a.tpu_14b:
        tpu_14b(a.layers, a.cases)
    if a.tpu_linears:
        tpu_linears()
    if a.weights:
        weight_memory()
    if a.weights_error:
        weights_error()
        flux_weights_error()
    if a.attention:
        attention_error(a.L, a.heads, a.K, a.score_std)
    if a.tpu_hlo:
        tpu_hlo(a.L, 12, a.K)


if __name__ == "__main__":
    main()
