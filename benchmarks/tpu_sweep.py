"""Attention tiles and kernel variants swept on a real TPU chip (what chose the rows of
``ditax.attention.tuning``), plus the two measurements that decide the 8-bit path: an int8 x
int8 GEMM against bf16 at the model's shapes. One JSON line per case (``bench``, ``case``,
``metric``, ``value``, ``unit`` and the settings), written to stdout and appended to
``--out``.

    source benchmarks/tpu_setup.sh
    python benchmarks/tpu_sweep.py --part attention --out $OUT/sweep.jsonl --budget-s 300

Each case is compiled, run once, then timed ``--repeats`` times (median). ``--budget-s``
stops starting new cases once spent, so a call on a lent chip ends inside its limit.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jax
from bench_lines import emit
import jax.numpy as jnp
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

PEAK = {"v5e": (197e12, 394e12), "v6e": (918e12, 1836e12)}   # bf16 FLOP/s, int8 OP/s


def _gen() -> str:
    from ditax.attention.tuning import generation

    return generation(jax.devices()[0].device_kind) or "cpu"


def timed(fn, args, repeats: int) -> tuple[float, float]:
    """(compile + first run s, median of ``repeats`` runs s) of ``jax.jit(fn)(*args)``."""
    f = jax.jit(fn)
    t0 = time.perf_counter()
    jax.block_until_ready(f(*args))
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        times.append(time.perf_counter() - t0)
    return first, statistics.median(times)


class Sweep:
    def __init__(self, out: str | None, budget_s: float, repeats: int):
        self.out, self.deadline, self.repeats = out, time.time() + budget_s, repeats

    def emit(self, row: dict) -> None:
        emit({"device_kind": jax.devices()[0].device_kind, **row}, self.out)

    def case(self, name: str, fn, args, flops: float, peak: float, **settings) -> None:
        if time.time() > self.deadline:
            self.emit({"bench": "tpu_sweep", "case": name, "skipped": "budget", **settings})
            return
        try:
            first, med = timed(fn, args, self.repeats)
        except Exception as e:   # one failed variant must not end the sweep
            self.emit({"bench": "tpu_sweep", "case": name, "error": str(e).splitlines()[0][:300],
                       **settings})
            return
        self.emit({"bench": "tpu_sweep", "case": name, "metric": "time", "value": med,
                   "unit": "s", "compile_plus_first_s": round(first, 2), "flops": flops,
                   "tflops": round(flops / med / 1e12, 1), "mfu": round(flops / med / peak, 3),
                   **settings})


def attention_cases(sw: Sweep, shape, variants, grad: bool) -> None:
    """Each ``(backend, options)`` of ``variants`` at q/k/v ``shape`` ``[B, L, N, K]`` bf16,
    forward (and with ``grad`` forward + backward)."""
    from ditax.attention import attend

    B, L, N, K = shape
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    q, k, v = (jax.random.normal(x, shape, jnp.bfloat16) for x in keys)
    fwd = 4.0 * B * N * L * L * K
    peak = PEAK.get(_gen(), (197e12,))[0]
    for backend, opts in variants:
        def f(q, k, v, backend=backend, opts=opts):
            return attend(q, k, v, backend=backend, **opts)

        tag = f"{backend} " + " ".join(f"{a}={b}" for a, b in sorted(opts.items()))
        sw.case(f"attention fwd L={L} N={N} K={K} {tag}", f, (q, k, v), fwd, peak,
                backend=backend, options=opts, shape=list(shape), direction="fwd")
        if grad:
            def g(q, k, v, f=f):
                loss = lambda q, k, v: jnp.sum(f(q, k, v).astype(jnp.float32))  # noqa: E731
                return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

            sw.case(f"attention fwd+bwd L={L} N={N} K={K} {tag}", g, (q, k, v), 3.5 * fwd,
                    peak, backend=backend, options=opts, shape=list(shape),
                    direction="fwd+bwd")


def cross_cases(sw: Sweep, lq: int, lk: int, heads: int, variants) -> None:
    """Splash cross-attention (``lq`` queries against ``lk`` text keys, head-major bf16, as
    Wan's blocks call it) under each tile setting of ``variants``: the profile's 31.5 ms a
    480p forward (30 layers) is ~98 TFLOP/s against the self-attention's ~179."""
    from ditax.attention.splash import splash_attention

    keys = jax.random.split(jax.random.PRNGKey(1), 3)
    q = jax.random.normal(keys[0], (1, heads, lq, 128), jnp.bfloat16)
    k, v = (jax.random.normal(x, (1, heads, lk, 128), jnp.bfloat16) for x in keys[1:])
    peak = PEAK.get(_gen(), (197e12,))[0]
    for opts in variants:
        def f(q, k, v, opts=opts):
            return splash_attention(q, k, v, head_major=True, **opts)

        tag = " ".join(f"{a}={b}" for a, b in sorted(opts.items())) or "table"
        sw.case(f"cross-attention fwd Lq={lq} Lk={lk} N={heads} {tag}", f, (q, k, v),
                4.0 * heads * lq * lk * 128, peak, backend="splash", options=opts,
                direction="fwd")


def projection_cases(sw: Sweep, length: int, heads: int, rows_list) -> None:
    """A Wan attention projection (``[L, D] x [D, N·K]`` head-major, bf16) with what follows
    it: the self-attention query's norm, RoPE and softmax scale, and the cross-attention
    query's norm and scale — XLA's dot and fusions (``xla``, :func:`ditax.nn.head_projection.
    reference`) against the one-kernel projection at each row block of ``rows_list``."""
    import numpy as np

    from ditax.nn.head_projection import HeadProjection, project_heads, reference
    from ditax.nn.rope import pair_tables

    k, d = 128, heads * 128
    keys = jax.random.split(jax.random.PRNGKey(2), 4)
    x = jax.random.normal(keys[0], (1, length, d), jnp.bfloat16)
    w = (jax.random.normal(keys[1], (heads, d, k)) * d ** -0.5).astype(jnp.bfloat16)
    b = jax.random.normal(keys[2], (d,), jnp.float32).astype(jnp.bfloat16)
    nw = jnp.ones((d,), jnp.float32)
    ang = np.random.default_rng(0).uniform(0, 6, (length, k // 2))
    cos, sin = (jnp.asarray(t) for t in pair_tables(ang))
    peak = PEAK.get(_gen(), (197e12,))[0]
    flops = 2.0 * length * d * d
    for what, rope in (("self q", True), ("cross q", False)):
        tab = (cos, sin) if rope else None
        for rows in [None] + list(rows_list):
            spec = HeadProjection(norm=True, rope=rope, scale=k ** -0.5, rows=rows)
            if rows is None:
                def f(x, w, b, nw, spec=spec, tab=tab):
                    return reference(x, w, b, nw, *(tab or (None, None)), spec)
            else:
                def f(x, w, b, nw, spec=spec, tab=tab):
                    return project_heads(x, w, b, nw, tab, spec=spec)
            sw.case(f"projection {what} L={length} D={d} {'xla' if rows is None else rows}",
                    f, (x, w, b, nw), flops, peak, rows=rows or 0, what=what)


def int8_cases(sw: Sweep, shapes) -> None:
    """``[M, Kd] x [Kd, Nd]`` as bf16 x bf16 -> bf16 and int8 x int8 -> int32 (and the int8
    path with a per-token quantization of x and the rescale, as ditax's W+A Linear runs it)."""
    peaks = PEAK.get(_gen(), (197e12, 394e12))
    for M, Kd, Nd in shapes:
        x = jax.random.normal(jax.random.PRNGKey(1), (M, Kd), jnp.bfloat16)
        w = jax.random.normal(jax.random.PRNGKey(2), (Kd, Nd), jnp.bfloat16)
        x8 = jnp.clip(jnp.round(x * 40), -127, 127).astype(jnp.int8)
        w8 = jnp.clip(jnp.round(w * 40), -127, 127).astype(jnp.int8)
        s = jnp.ones((Nd,), jnp.float32)
        flops = 2.0 * M * Kd * Nd
        sw.case(f"gemm bf16 {M}x{Kd}x{Nd}", lambda a, b: a @ b, (x, w), flops, peaks[0],
                dtype="bf16")
        sw.case(f"gemm int8 {M}x{Kd}x{Nd}",
                lambda a, b: jax.lax.dot(a, b, preferred_element_type=jnp.int32), (x8, w8),
                flops, peaks[1], dtype="int8")

        def wa(a, b, s):
            sa = jnp.max(jnp.abs(a.astype(jnp.float32)), axis=1, keepdims=True) / 127.0
            a8 = jnp.clip(jnp.round(a / sa), -127, 127).astype(jnp.int8)
            y = jax.lax.dot(a8, b, preferred_element_type=jnp.int32)
            return (y.astype(jnp.float32) * sa * s).astype(jnp.bfloat16)

        sw.case(f"gemm int8 W+A quantized {M}x{Kd}x{Nd}", wa, (x, w8, s), flops, peaks[1],
                dtype="int8+quant")


def model_case(sw: Sweep, config: str, overrides, latent, name: str, text_len: int = 512,
               profile: bool = False, flops_shape=None) -> dict:
    """``ditax bench``'s forward of ``config`` with ``overrides`` at ``latent`` (F, Y, X; None:
    the family's bench default); ``flops_shape``: the latent ``(C, F, Y, X)`` the family's
    FLOP count takes (default: the transformer input's shape after its batch)."""
    from ditax.bench import forward_benchmark
    from ditax.config import load_config
    from ditax.models.base import model_family
    from ditax.parallel import make_mesh

    if time.time() > sw.deadline:
        sw.emit({"bench": "tpu_sweep", "case": name, "skipped": "budget"})
        return {}
    try:
        cfg = load_config(config, list(overrides))
        mesh = make_mesh(cfg.mesh)
        from chip_profile import op_breakdown

        before = device_stats()

        row = forward_benchmark(cfg, mesh, latent, text_len, sw.repeats,
                                after=op_breakdown if profile else None)
        fam = model_family(cfg.model, cfg.attention)
        shape = tuple(flops_shape or row["latent"][1:])
        flops = fam.flops_per_sample(shape, text_len) / 3.0
        peak = PEAK.get(_gen(), (197e12,))[0]
        row.update(case=name, overrides=list(overrides), flops=flops,
                   mfu=round(flops / row["value"] / peak, 3), memory_stats_before=before,
                   memory_stats=device_stats())
        row.update(case_peak(before, row["memory_stats"]))
        sw.emit(row)
        return row
    except Exception as e:
        sw.emit({"bench": "tpu_sweep", "case": name, "error": str(e).splitlines()[0][:300]})
        return {}


def device_stats() -> dict:
    """The first device's ``memory_stats()`` now (its peaks: since the process started);
    empty where the backend reports none."""
    return dict(jax.devices()[0].memory_stats() or {})


#: the two parts of a device's peak (TPU v5e, JAX 0.10.2, ``tpu_chip.py --part memprobe``):
#: buffers (arguments, outputs, generated code) and the loaded executables' temporaries,
#: which the runtime reserves whole per executable and does not count as in use
PEAK_PARTS = ("peak_bytes_in_use", "peak_bytes_reserved")
PEAK_HOW = ("peak_bytes_in_use + peak_bytes_reserved (buffers + the executables' reserved "
            "temporaries), each the case's own: it raised the process's peak")


def case_peak(before: dict, after: dict) -> dict:
    """A case's own peak from the device's stats ``before`` and ``after`` it: each part of
    :data:`PEAK_PARTS` (a runtime that reports no reserved bytes: 0) is the process's peak
    when the case raised it (or it is 0 throughout); ``peak_hbm_bytes`` is their sum when
    both are the case's, else null and ``peak_hbm_at_most`` bounds it (JAX cannot reset a
    peak; earlier cases' executables may still hold their reservations: ``bytes_reserved``
    in ``memory_stats_before`` says how much)."""
    if after.get("peak_bytes_in_use") is None:
        return {"peak_hbm_bytes": None}
    out, own = {}, True
    for k in PEAK_PARTS:
        a, b = after.get(k, 0), before.get(k)
        mine = b is None or a > b or a == 0
        out[k] = a if mine else None
        own = own and mine
    total = sum(after.get(k, 0) for k in PEAK_PARTS)
    out["peak_hbm_how"] = PEAK_HOW
    if own:
        return {**out, "peak_hbm_bytes": total}
    return {**out, "peak_hbm_bytes": None, "peak_hbm_at_most": total}


WAN = (1, 32760, 12, 128)        # Wan 2.1 1.3B, 480x832x81: 21 x 30 x 52 tokens


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", nargs="+", default=["attention", "int8"],
                   choices=["attention", "attention_bwd", "attention_quick", "cross",
                            "attention_quick_bwd", "flux2", "int8", "projections", "wan",
                            "wan_fused", "wan_projections", "wan_splash", "wan_transposed"])
    # (PARTS, below, holds what each part runs)
    p.add_argument("--out", default=None)
    p.add_argument("--budget-s", type=float, default=300)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    from ditax.tpu_env import raise_scoped_vmem

    raise_scoped_vmem()
    sw = Sweep(a.out, a.budget_s, a.repeats)
    for part in a.part:              # in the order given: the budget cuts the last ones
        PARTS[part](sw)


def _wan_projections(sw: Sweep, modes=("xla", "fused")) -> None:
    """Wan 1.3B 480p forward (splash) with XLA's projections, then the fused ones (profiled)."""
    for mode in modes:
        model_case(sw, "wan2.1-t2v-1.3b", ["model.dtype=bfloat16", "attention.backend=splash",
                                           f"model.projections={mode}"],
                   (21, 60, 104), f"wan2.1-1.3b 480x832x81 splash projections={mode}",
                   profile=mode == "fused")


def _wan_transposed(sw: Sweep) -> None:
    """The fused forward with the hidden state handed to the kernels transposed
    (``head_projection.TRANSPOSED_INPUT``: may XLA keep it features-major?), profiled."""
    from ditax.nn import head_projection

    head_projection.TRANSPOSED_INPUT = True
    try:
        model_case(sw, "wan2.1-t2v-1.3b", ["model.dtype=bfloat16", "attention.backend=splash",
                                           "model.projections=fused"], (21, 60, 104),
                   "wan2.1-1.3b 480x832x81 splash projections=fused, hidden state transposed",
                   profile=True)
    finally:
        head_projection.TRANSPOSED_INPUT = False


def _wan(sw: Sweep, backends) -> None:
    for b in backends:
        model_case(sw, "wan2.1-t2v-1.3b", ["model.dtype=bfloat16", f"attention.backend={b}"],
                   (21, 60, 104), f"wan2.1-1.3b 480x832x81 {b}", profile=b == "splash")


PARTS = {
    "attention": lambda sw: attention_cases(sw, WAN, [
        ("splash", {}),
        ("splash", dict(block_q=1024, block_kv=2048, block_kv_compute=1024)),
        ("flash", {}),
        ("flash", dict(block_q=1024, block_kv=2048, block_kv_compute=1024)),
        ("flash", dict(block_q=2048, block_kv=2048, block_kv_compute=1024)),
        ("flash", dict(block_q=2048, block_kv=4096, block_kv_compute=512)),
        ("flash", dict(block_q=512, block_kv=512, block_kv_compute=512)),
    ], grad=False),
    "attention_bwd": lambda sw: attention_cases(sw, WAN, [
        ("splash", {}),
        ("splash", dict(block_q_bwd=512, block_kv_bwd=512)),
        ("splash", dict(fused_bwd=True)),
        ("flash", {}),
        ("flash", dict(block_q_bwd=512, block_kv_bwd=1024)),
    ], grad=True),
    "int8": lambda sw: int8_cases(sw, [(32768, 1536, 1536), (32768, 1536, 8960)]),
    "attention_quick": lambda sw: attention_cases(sw, WAN, [
        ("splash", {}), ("flash", {}),
        ("flash", dict(block_q=1024, block_kv=2048, block_kv_compute=1024)),
    ], grad=False),
    "attention_quick_bwd": lambda sw: attention_cases(sw, WAN, [("splash", {}), ("flash", {})],
                                                      grad=True),
    "flux2": lambda sw: model_case(sw, "flux.2-klein-4b", ["model.dtype=bfloat16",
                                                           "attention.backend=splash"], None,
                                   "FLUX.2-klein-4B forward 1024x1024 splash",
                                   flops_shape=(128, 1, 64, 64)),
    "cross": lambda sw: cross_cases(sw, 32768, 512, 12, [{}] + [
        dict(block_q=b, block_kv=512, block_kv_compute=kc) for b in (1024, 2048, 4096, 8192)
        for kc in (256, 512)]),
    "projections": lambda sw: projection_cases(sw, 32768, 12, (256, 512, 1024)),
    "wan_projections": _wan_projections,
    "wan_fused": lambda sw: _wan_projections(sw, ("fused",)),
    "wan_transposed": _wan_transposed,
    "wan": lambda sw: _wan(sw, ("splash", "flash")),
    "wan_splash": lambda sw: _wan(sw, ("splash",)),
}


if __name__ == "__main__":
    main()
