"""Attention backend benchmark: one JSON object per line.

    {"bench": "attention", "case": ..., "backend": ..., "metric": ..., "value": ..., "unit": ...}

Metrics per (case, backend): ``fwd_time`` / ``fwdbwd_time`` (median seconds over
``--repeats`` runs after a compile+warm-up run), ``fwd_tflops`` / ``fwdbwd_tflops`` (achieved,
counting ``4·B·N·Lq·Lk·K`` flops forward and 2.5× that backward, the usual flash-attention
convention), ``fwd_temp`` / ``fwdbwd_temp`` (XLA's compiled ``memory_analysis()`` temp bytes),
and on GPU ``peak_bytes`` (``peak_bytes_in_use`` of the device). A backend that cannot run
prints ``metric: "unavailable"`` with the reason; a run that fails (e.g. out of memory)
prints ``metric: "error"``.

CPU default (under two minutes): xla, blockwise and reference at L=1024, N=4, K=64 float32,
plus a compile-only temp-memory comparison of xla vs blockwise at ``--mem-L`` (8192).

``--gpu-check`` (on a CUDA GPU): cudnn, te (if importable), xla, blockwise in bf16 at
L=32760, N=12, K=128 (Wan 1.3B 480p self-attention), the 14B-720p per-device shape under
8-way Ulysses (L=75600, N=40/8=5, K=128), 14B-720p text cross-attention (Lq=75600, T=512,
N=5), and a measured bf16 matmul TFLOP/s ceiling for comparison.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp

from ditax.attention import AttentionUnavailable, attend


def emit(case, backend, metric, value, unit, **extra):
    print(json.dumps({"bench": "attention", "case": case, "backend": backend,
                      "metric": metric, "value": value, "unit": unit, **extra}), flush=True)


def median_time(fn, args, repeats):
    jax.block_until_ready(fn(*args))  # compile + warm-up
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def temp_bytes(fn, args):
    try:
        ma = fn.lower(*args).compile().memory_analysis()
        return None if ma is None else int(ma.temp_size_in_bytes)
    except Exception:  # noqa: BLE001 - not every backend reports it
        return None


def make_fns(backend, options):
    def fwd(q, k, v):
        return attend(q, k, v, backend=backend, **options)

    def loss(q, k, v, ct):
        return jnp.sum(fwd(q, k, v).astype(jnp.float32) * ct)

    return jax.jit(fwd), jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def bench_case(backend, B, Lq, Lk, N, K, dtype, repeats, options=None, backward=True):
    case = f"B{B}_Lq{Lq}_Lk{Lk}_N{N}_K{K}_{jnp.dtype(dtype).name}"
    key = jax.random.split(jax.random.PRNGKey(0), 4)
    q = jax.random.normal(key[0], (B, Lq, N, K), jnp.float32).astype(dtype)
    k = jax.random.normal(key[1], (B, Lk, N, K), jnp.float32).astype(dtype)
    v = jax.random.normal(key[2], (B, Lk, N, K), jnp.float32).astype(dtype)
    ct = jax.random.normal(key[3], (B, Lq, N, K), jnp.float32)
    flops = 4.0 * B * N * Lq * Lk * K
    fwd, grad = make_fns(backend, options or {})
    passes = [("fwd", fwd, (q, k, v), flops)]
    if backward:
        passes.append(("fwdbwd", grad, (q, k, v, ct), 3.5 * flops))
    for name, fn, args, fl in passes:
        try:
            t = median_time(fn, args, repeats)
        except AttentionUnavailable as e:
            emit(case, backend, "unavailable", None, None, reason=str(e))
            return
        except Exception as e:  # noqa: BLE001 - report and continue with the next backend
            emit(case, backend, "error", None, None, reason=f"{type(e).__name__}: {e}"[:400])
            continue
        emit(case, backend, f"{name}_time", t, "s")
        emit(case, backend, f"{name}_tflops", fl / t / 1e12, "TFLOP/s")
        tb = temp_bytes(fn, args)
        if tb is not None:
            emit(case, backend, f"{name}_temp", tb, "bytes")
        stats = getattr(jax.devices()[0], "memory_stats", lambda: None)()
        if stats and "peak_bytes_in_use" in stats:
            emit(case, backend, "peak_bytes", int(stats["peak_bytes_in_use"]), "bytes")


def memory_compare(L, N, K, dtype, block_kv):
    """Compile-only temp bytes of xla vs blockwise (fwd and fwd+bwd) at long L."""
    case = f"B1_Lq{L}_Lk{L}_N{N}_K{K}_{jnp.dtype(dtype).name}"
    x = jax.ShapeDtypeStruct((1, L, N, K), dtype)
    ct = jax.ShapeDtypeStruct((1, L, N, K), jnp.float32)
    for backend, opts in (("xla", {}), ("blockwise", {"block_kv": block_kv})):
        fwd, grad = make_fns(backend, opts)
        for name, fn, args in (("fwd", fwd, (x, x, x)), ("fwdbwd", grad, (x, x, x, ct))):
            tb = temp_bytes(fn, args)
            emit(case, backend, f"{name}_temp", tb, "bytes", compile_only=True)


def matmul_ceiling(n=8192, repeats=10):
    a = jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.bfloat16)
    f = jax.jit(lambda a, b: a @ b)
    t = median_time(f, (a, a), repeats)
    emit(f"matmul_{n}", "xla", "bf16_matmul_tflops", 2.0 * n ** 3 / t / 1e12, "TFLOP/s")


def gpu_check(repeats):
    from ditax.attention import platform

    if not platform.has_cuda_gpu():
        emit("gpu_check", "-", "unavailable", None, None, reason=platform.no_cuda_reason())
        return
    backends = ["cudnn", "xla", "blockwise"]   # flash is the TPU (Mosaic) kernel: refuses on GPU
    te_ctx = None
    if platform.has_transformer_engine_jax():
        from ditax.attention.te import configure_te

        te_ctx = configure_te(None)  # entry-point setup, visibly here
        te_ctx.__enter__()
        backends.insert(1, "te")
    try:
        matmul_ceiling()
        shapes = [(1, 32760, 32760, 12, 128),   # Wan 1.3B 480p self-attention
                  (1, 75600, 75600, 5, 128),    # Wan 14B 720p per device, Ulysses 8
                  (1, 75600, 512, 5, 128)]      # its text cross-attention
        for B, Lq, Lk, N, K in shapes:
            for b in backends:
                if b == "xla" and Lq * Lk > 32760 * 32760:
                    continue  # the full score matrix does not fit
                bench_case(b, B, Lq, Lk, N, K, jnp.bfloat16, repeats,
                           options={"block_kv": 1024} if b == "blockwise" else None)
    finally:
        if te_ctx is not None:
            te_ctx.__exit__(None, None, None)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backends", default=None,
                   help="comma list (default: CPU xla,blockwise,reference; GPU cudnn,xla,blockwise)")
    p.add_argument("--B", type=int, default=1)
    p.add_argument("--L", type=int, default=1024, help="query length")
    p.add_argument("--Lk", type=int, default=None, help="key length (default: --L)")
    p.add_argument("--N", type=int, default=4)
    p.add_argument("--K", type=int, default=64)
    p.add_argument("--dtype", default=None, help="float32 | bfloat16 (default: f32 on CPU)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--block-kv", type=int, default=512, help="blockwise block size")
    p.add_argument("--mem-L", type=int, default=8192, help="L of the memory comparison (0: off)")
    p.add_argument("--no-backward", action="store_true")
    p.add_argument("--gpu-check", action="store_true")
    a = p.parse_args(argv)

    if a.gpu_check:
        gpu_check(a.repeats)
        return
    on_cpu = jax.default_backend() == "cpu"
    backends = (a.backends or ("xla,blockwise,reference" if on_cpu else "cudnn,xla,blockwise"))
    dtype = jnp.dtype(a.dtype or ("float32" if on_cpu else "bfloat16"))
    for b in backends.split(","):
        opts = {"block_kv": a.block_kv} if b == "blockwise" else None
        bench_case(b, a.B, a.L, a.Lk or a.L, a.N, a.K, dtype, a.repeats, opts,
                   backward=not a.no_backward)
    if a.mem_L:
        memory_compare(a.mem_L, 1, a.K, dtype, a.block_kv)


if __name__ == "__main__":
    sys.exit(main())
