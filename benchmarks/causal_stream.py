"""Causal streaming speed (issue 59 item 5): one JSON object per line,

    {"bench": "causal_stream", "case": ..., "metric": ..., "value": ..., "unit": ..., ...}

A Wan transformer with random weights (``--size 1.3b``: Wan 2.1 1.3B's shape; ``tiny``: a
CPU smoke size) sampled causally at ``--height`` x ``--width``: ``--chunks`` chunks of
``--chunk`` latent frames, ``--steps`` Euler steps each, the KV cache holding the sink and
``--context-chunks`` chunks (:class:`ditax.pipelines.causal.CausalSampler`). Reported: the
chunk program's compile seconds, the time to the first chunk (compiled), the median seconds
a later chunk, the video frames per second while streaming (4 video frames a latent frame)
and its ratio to ``--fps`` (real time), the KV cache's bytes, the device's peak memory where
it reports one. The latents only: the VAE decode is ``benchmarks/vae_decode.py``'s.

    python benchmarks/causal_stream.py [--size 1.3b] [--height 480] [--width 832]
        [--chunk 3] [--chunks 28] [--context-chunks 3] [--steps 4] [--attention auto]
        [--dtype bfloat16] [--fps 16] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

SIZES = {
    "1.3b": dict(),     # WanConfig's defaults are Wan 2.1 1.3B's shape
    "tiny": dict(num_attention_heads=2, attention_head_dim=16, ffn_dim=48, num_layers=2,
                 text_dim=32, freq_dim=16),
}


def main(argv=None) -> None:
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
    p.add_argument("--text-tokens", type=int, default=512)
    p.add_argument("--fps", type=float, default=16.0, help="real time, video frames a second")
    p.add_argument("--out", default=None, help="also append the lines to this file")
    p.add_argument("--profile", action="store_true",
                   help="also profile one chunk once the cache is full (the device's ops)")
    a = p.parse_args(argv)

    import jax
    import jax.numpy as jnp
    import numpy as np

    from ditax.config import AttentionConfig, ModelConfig
    from ditax.models.wan import kv_cache
    from ditax.models.wan.build import init_model
    from ditax.pipelines.causal import CausalSampler, compiled_chunk_programs
    from ditax.schedulers.flow_match import FlowMatchEulerScheduler

    cfg = ModelConfig(dtype=a.dtype, **SIZES[a.size])
    model = init_model(cfg, AttentionConfig(backend=a.attention), seed=0)
    y, x = a.height // 8, a.width // 8
    sigmas = tuple(float(s) for s in np.linspace(1.0, 0.0, a.steps + 1)[:-1])
    text = jnp.asarray(np.random.default_rng(0).standard_normal(
        (1, a.text_tokens, cfg.text_dim)), jnp.dtype(a.dtype))
    sampler = CausalSampler(model, kv_cache, FlowMatchEulerScheduler(shift=5.0), a.chunk,
                            a.context_chunks)
    case = (f"wan{a.size}_{a.height}x{a.width}_chunk{a.chunk}x{a.chunks}_ctx"
            f"{a.context_chunks}_steps{a.steps}_{a.dtype}")
    lines = []

    def emit(metric, value, unit, **extra):
        row = {"bench": "causal_stream", "case": case, "metric": metric, "value": value,
               "unit": unit, "platform": jax.devices()[0].platform, "attention": a.attention,
               **extra}
        lines.append(row)
        print(json.dumps(row), flush=True)

    kw = dict(num_frames=a.chunk * a.chunks, latent_hw=(y, x), num_inference_steps=a.steps,
              sigmas=sigmas, seed=0)
    # a one-chunk run compiles the chunk program (the same shapes as the long run's)
    t0 = time.perf_counter()
    before = compiled_chunk_programs()
    warm = CausalSampler(model, kv_cache, sampler.scheduler, a.chunk, a.context_chunks)
    next(warm.stream(text, **kw))
    emit("compile_and_first_chunk", time.perf_counter() - t0, "s")
    t0, stamps = time.perf_counter(), []
    for _ in sampler.stream(text, **kw):
        stamps.append(time.perf_counter() - t0)
    per_chunk = statistics.median(np.diff(stamps)) if len(stamps) > 1 else stamps[0]
    fps = 4 * a.chunk / per_chunk
    emit("first_chunk", stamps[0], "s")
    emit("chunk_median", per_chunk, "s", chunks=len(stamps))
    emit("frames_per_second", fps, "frames/s")
    emit("vs_real_time", fps / a.fps, "ratio", real_time_fps=a.fps)
    emit("kv_cache_bytes", sampler.last_stats["cache_bytes"], "bytes",
         shape=list(sampler.last_stats["cache_shape"]))
    emit("chunk_programs_compiled", compiled_chunk_programs() - before, "programs")
    stats = getattr(jax.devices()[0], "memory_stats", lambda: None)() or {}
    if "peak_bytes_in_use" in stats:
        emit("device_peak_bytes", stats["peak_bytes_in_use"], "bytes")
    if a.profile:    # a chunk with the cache full: where its time goes
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from chip_profile import op_breakdown

        gen = CausalSampler(model, kv_cache, sampler.scheduler, a.chunk,
                            a.context_chunks).stream(text, **kw)
        for _ in range(min(a.context_chunks + 1, a.chunks - 1)):
            jax.block_until_ready(next(gen))
        prof = op_breakdown(lambda: jax.block_until_ready(next(gen)))
        emit("profile_chunk_device_ms", prof.get("device_ms"), "ms", profile=prof)
    if a.out:
        with open(a.out, "a") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in lines)


if __name__ == "__main__":
    from ditax.tpu_env import raise_scoped_vmem

    raise_scoped_vmem()    # as every ditax command does: splash's large-tile row needs it
    main()
