"""Causal streaming speed (issue 59 item 5): one JSON object per line,

    {"bench": "causal_stream", "case": ..., "metric": ..., "value": ..., "unit": ..., ...}

A Wan transformer with random weights (``--size 1.3b``: Wan 2.1 1.3B's shape; ``tiny``: a
CPU smoke size) sampled causally at ``--height`` x ``--width``: ``--chunks`` chunks of
``--chunk`` latent frames, ``--steps`` Euler steps each, the KV cache holding the sink and
``--context-chunks`` chunks (:class:`ditax.pipelines.causal.CausalSampler`), the block
linears in ``--quantize`` (``int8``: 8-bit weights; with ``--quantize-activations`` 8-bit x
8-bit dots, as ``model.quantize=int8 model.quantize_activations=true``). Reported: the chunk
program's compile seconds, the time to the first chunk (compiled), the median seconds a
later chunk, the video frames per second while streaming (4 video frames a latent frame)
and its ratio to ``--fps`` (real time), the model FLOPs a chunk (:func:`chunk_flops`) and
the rate they ran at, the KV cache's bytes, the device's peak memory where it reports one
(the process's peak so far). The latents only: the VAE decode is
``benchmarks/vae_decode.py``'s.

``--cases ctx1_steps3_int8wa,ctx1_steps3,ctx3_steps4`` runs several settings in one process
(each ``ctx<C>_steps<S>[_int8 | _int8wa]`` sets ``--context-chunks``, ``--steps`` and the
8-bit mode; the model is built again only when the mode changes); ``--budget-s``: a case (or
the profile) starts only while the seconds spent plus the longest case so far fit the
budget, else one ``skipped`` line says so.

    python benchmarks/causal_stream.py [--size 1.3b] [--height 480] [--width 832]
        [--chunk 3] [--chunks 28] [--context-chunks 3] [--steps 4] [--attention auto]
        [--dtype bfloat16] [--quantize none] [--quantize-activations] [--fps 16]
        [--cases LIST] [--budget-s SECONDS] [--profile] [--out FILE]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import statistics
import sys
import time
from bench_lines import append

SIZES = {
    "1.3b": dict(),     # WanConfig's defaults are Wan 2.1 1.3B's shape
    "tiny": dict(num_attention_heads=2, attention_head_dim=16, ffn_dim=48, num_layers=2,
                 text_dim=32, freq_dim=16),
}

CASE = re.compile(r"ctx(\d+)_steps(\d+)(?:_(int8|int8wa))?$")


def parse_case(text: str) -> dict:
    """``ctx<C>_steps<S>[_int8 | _int8wa]`` -> the settings it names (one clear line if it
    names none)."""
    m = CASE.match(text.strip())
    if not m:
        raise SystemExit(f"--cases: {text!r} is not ctx<C>_steps<S>[_int8|_int8wa] "
                         f"(e.g. ctx1_steps3_int8wa)")
    mode = m.group(3) or "none"
    return dict(context_chunks=int(m.group(1)), steps=int(m.group(2)),
                quantize="none" if mode == "none" else "int8", activations=mode == "int8wa")


def chunk_flops(cfg, tokens: int, keys: int, steps: int, text_tokens: int,
                rows: int = 1) -> dict:
    """Model FLOPs of one chunk of ``tokens`` query tokens whose self-attention sees ``keys``
    keys (the cache's valid slots and the chunk; a kernel's padded counts give the work it
    does): ``steps`` forwards and the cache write, ``rows`` batch rows (2 with CFG). Per
    forward and layer: the block linears (q k v o, cross q o, FFN) on the tokens, self- and
    cross-attention (2 FLOPs a multiply-add of QK^T and PV), the text k / v projections; per
    forward the text embedding."""
    d, f, n = cfg.num_attention_heads * cfg.attention_head_dim, cfg.ffn_dim, cfg.num_layers
    t = text_tokens
    forwards = (steps + 1) * rows
    parts = {"linear": 2 * (6 * d * d + 2 * d * f) * tokens * n,
             "self_attention": 4 * tokens * keys * d * n,
             "cross_attention": 4 * tokens * t * d * n + 4 * t * d * d * n,
             "text": 2 * t * (cfg.text_dim * d + d * d)}
    out = {k: v * forwards for k, v in parts.items()}
    out["total"] = sum(out.values())
    return out


def _args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=sorted(SIZES), default="1.3b")
    p.add_argument("--height", type=int, default=480)
    p.add_argument("--width", type=int, default=832)
    p.add_argument("--chunk", type=int, default=3, help="latent frames a chunk")
    p.add_argument("--chunks", type=int, default=28, help="chunks (28 x 3 = 4x Wan's 21)")
    p.add_argument("--context-chunks", type=int, default=3)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--attention", default="auto")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--param-dtype", default="float32",
                   help="the weights' storage dtype (bfloat16: a bf16 student)")
    p.add_argument("--quantize", choices=("none", "int8", "fp8"), default="none")
    p.add_argument("--quantize-activations", action="store_true")
    p.add_argument("--text-tokens", type=int, default=512)
    p.add_argument("--fps", type=float, default=16.0, help="real time, video frames a second")
    p.add_argument("--cases", default=None, help="ctx<C>_steps<S>[_int8|_int8wa],...")
    p.add_argument("--budget-s", type=float, default=None,
                   help="start a case / the profile only while it fits these seconds")
    p.add_argument("--out", default=None, help="also append the lines to this file")
    p.add_argument("--profile", action="store_true",
                   help="also profile one chunk once the cache is full (the device's ops)")
    return p.parse_args(argv)


def main(argv=None) -> None:
    a = _args(argv)
    cases = ([parse_case(c) for c in a.cases.split(",")] if a.cases else
             [dict(context_chunks=a.context_chunks, steps=a.steps, quantize=a.quantize,
                   activations=a.quantize_activations)])
    lines, start, longest, built = [], time.perf_counter(), 0.0, None
    for c in cases:
        name = (f"wan{a.size}_{a.height}x{a.width}_chunk{a.chunk}x{a.chunks}_ctx"
                f"{c['context_chunks']}_steps{c['steps']}_{a.dtype}"
                + ("" if c["quantize"] == "none" else
                   f"_{c['quantize']}{'wa' if c['activations'] else ''}")
                + ("" if a.param_dtype == "float32" else f"_{a.param_dtype}_weights"))
        spent = time.perf_counter() - start
        if a.budget_s is not None and spent + longest > a.budget_s:
            _say(lines, name, "skipped", 0, "", reason=f"{spent:.0f} s spent + the longest "
                 f"case {longest:.0f} s > --budget-s {a.budget_s:g}")
            continue
        t0 = time.perf_counter()
        key = (c["quantize"], c["activations"])
        if built is None or built[0] != key:
            built = None
            gc.collect()        # the previous mode's weights freed before the next is drawn
            built = (key, _build(a, c))
        lines += _run_case(a, c, name, built[1], lambda: (
            float("inf") if a.budget_s is None else a.budget_s - (time.perf_counter() - start)))
        took = time.perf_counter() - t0
        longest = max(longest, took)
        _say(lines, name, "case_seconds", took, "s", what="the case's wall time, its model "
             "build included")
    append(lines, a.out)


def _say(lines: list, case: str, metric: str, value, unit: str, **extra) -> None:
    """Print one line and keep it for ``--out``."""
    row = {"bench": "causal_stream", "case": case, "metric": metric, "value": value,
           "unit": unit, **extra}
    lines.append(row)
    print(json.dumps(row), flush=True)


def _build(a, c):
    """The random model of ``c``'s 8-bit mode and its text embeddings."""
    import jax.numpy as jnp
    import numpy as np

    from ditax.config import AttentionConfig, ModelConfig
    from ditax.models.wan.build import init_model

    cfg = ModelConfig(dtype=a.dtype, param_dtype=a.param_dtype, quantize=c["quantize"],
                      quantize_activations=c["activations"], **SIZES[a.size])
    model = init_model(cfg, AttentionConfig(backend=a.attention), seed=0)
    text = jnp.asarray(np.random.default_rng(0).standard_normal(
        (1, a.text_tokens, cfg.text_dim)), jnp.dtype(a.dtype))
    return model, text


def _run_case(a, c, name: str, built, left) -> list:
    """One setting's lines (see the module docstring); ``left()``: the budget's seconds
    left (the profile needs its chunks and ~30 s for the trace)."""
    import jax
    import numpy as np

    from ditax.models.wan import kv_cache
    from ditax.pipelines.causal import CausalSampler, compiled_chunk_programs
    from ditax.schedulers.flow_match import FlowMatchEulerScheduler

    model, text = built
    cfg, ctx, steps = model.cfg, c["context_chunks"], c["steps"]
    y, x = a.height // 8, a.width // 8
    sigmas = tuple(float(s) for s in np.linspace(1.0, 0.0, steps + 1)[:-1])
    sched = FlowMatchEulerScheduler(shift=5.0)
    sampler = CausalSampler(model, kv_cache, sched, a.chunk, ctx)
    lines = []

    def emit(metric, value, unit, **extra):
        _say(lines, name, metric, value, unit, platform=jax.devices()[0].platform,
             attention=a.attention, **extra)

    kw = dict(num_frames=a.chunk * a.chunks, latent_hw=(y, x), num_inference_steps=steps,
              sigmas=sigmas, seed=0)
    # a one-chunk run compiles the chunk program (the same shapes as the long run's)
    t0 = time.perf_counter()
    before = compiled_chunk_programs()
    next(CausalSampler(model, kv_cache, sched, a.chunk, ctx).stream(text, **kw))
    emit("compile_and_first_chunk", time.perf_counter() - t0, "s")
    t0, stamps = time.perf_counter(), []
    for _ in sampler.stream(text, **kw):
        stamps.append(time.perf_counter() - t0)
    per_chunk = statistics.median(np.diff(stamps)) if len(stamps) > 1 else stamps[0]
    fps = 4 * a.chunk / per_chunk
    _, tokens, _ = kv_cache.chunk_tokens(model, (a.chunk, y, x))
    flops = chunk_flops(cfg, tokens, (ctx + 2) * tokens, steps, a.text_tokens)
    emit("first_chunk", stamps[0], "s")
    emit("chunk_median", per_chunk, "s", chunks=len(stamps))
    emit("frames_per_second", fps, "frames/s")
    emit("vs_real_time", fps / a.fps, "ratio", real_time_fps=a.fps)
    emit("flops_per_chunk", flops["total"], "FLOPs", parts=flops)
    emit("model_tflops_per_s", flops["total"] / per_chunk / 1e12, "TFLOP/s")
    emit("kv_cache_bytes", sampler.last_stats["cache_bytes"], "bytes",
         shape=list(sampler.last_stats["cache_shape"]))
    emit("chunk_programs_compiled", compiled_chunk_programs() - before, "programs")
    stats = getattr(jax.devices()[0], "memory_stats", lambda: None)() or {}
    if "peak_bytes_in_use" in stats:
        emit("device_peak_bytes", stats["peak_bytes_in_use"], "bytes", scope="process so far")
    need = (min(ctx + 1, a.chunks - 1) + 1) * per_chunk + 30.0
    if a.profile and need > left():
        emit("skipped", 0, "", reason=f"profile: needs ~{need:.0f} s, {left():.0f} s left of "
                                      f"--budget-s")
    elif a.profile:    # a chunk with the cache full: where its time goes
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from chip_profile import op_breakdown

        gen = CausalSampler(model, kv_cache, sched, a.chunk, ctx).stream(text, **kw)
        for _ in range(min(ctx + 1, a.chunks - 1)):
            jax.block_until_ready(next(gen))
        prof = op_breakdown(lambda: jax.block_until_ready(next(gen)))
        emit("profile_chunk_device_ms", prof.get("device_ms"), "ms", profile=prof)
    return lines


if __name__ == "__main__":
    from ditax.tpu_env import raise_scoped_vmem

    raise_scoped_vmem()    # as every ditax command does: splash's large-tile row needs it
    main()
