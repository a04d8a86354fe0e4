"""Training benchmarks (one JSON object per line).

1. ``speed``: step time and tokens/s of the ``tiny`` preset and of a 1.3B-width 2-layer model
   (D=1536, 12 heads, M=8960, text 4096) per mesh strategy on 8 (fake CPU) devices.
2. ``memory``: per-device memory of a Wan 2.1 14B training step at 720p / 81 frames
   (latent 16×21×90×160, text 512×4096), batch 1, on 8 devices, for fsdp=8, context=8 and
   fsdp=2×context=4, with and without remat — from ``jit(step).lower(abstract).compile()
   .memory_analysis()``; nothing is allocated.

Run: ``python benchmarks/train.py [--part speed|memory|all] [--layers 40] [--steps 3]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from ditax.config import load_config, replace  # noqa: E402
from ditax.parallel.axes import batch_shards  # noqa: E402
from ditax.parallel.mesh import make_mesh  # noqa: E402
from ditax.train.batches import BatchIterator  # noqa: E402
from ditax.train.step import Trainer  # noqa: E402

ONE = dict(data=1, fsdp=1, context=1, tensor=1)


def emit(**row):
    print(json.dumps({"bench": "train", **row}), flush=True)


def speed_case(name, cfg, sizes, steps):
    mesh = make_mesh({**ONE, **sizes})
    tr = Trainer(cfg, mesh)
    data = BatchIterator(cfg)
    st = tr.init()
    t0 = time.perf_counter()
    batch = tr.put_batch(next(data))
    st, m = tr.step(st, batch)
    float(m["loss"])
    compile_s = time.perf_counter() - t0
    times = []
    for _ in range(steps):
        batch = tr.put_batch(next(data))
        t0 = time.perf_counter()
        st, m = tr.step(st, batch)
        float(m["loss"])
        times.append(time.perf_counter() - t0)
    dt = float(np.median(times))
    lat = data.latent_shape
    tokens = cfg.batch_size * tr.family.tokens_per_sample(lat)
    flops = tr.family.flops_per_sample(lat, data.text_shape[0]) * cfg.batch_size
    common = dict(case=name, mesh=sizes, backend=cfg.attention.backend,
                  batch=cfg.batch_size, tokens_per_step=tokens)
    emit(**common, metric="step_time", value=dt, unit="s", first_step_s=compile_s)
    emit(**common, metric="tokens_per_s", value=tokens / dt, unit="tokens/s")
    emit(**common, metric="tflops_per_s_total", value=flops / dt / 1e12, unit="TFLOP/s")


def run_speed(steps):
    meshes = [("fsdp8", dict(fsdp=8), "xla"), ("context8", dict(context=8), "ulysses"),
              ("fsdp2_context4", dict(fsdp=2, context=4), "ulysses"),
              ("data2_fsdp2_context2", dict(data=2, fsdp=2, context=2), "xla"),
              ("fsdp4_tensor2", dict(fsdp=4, tensor=2), "xla")]
    tiny = load_config("tiny", ["model.num_attention_heads=8", "model.attention_head_dim=16"])
    for name, sizes, be in meshes:
        speed_case(f"tiny/{name}", replace(tiny, **{"attention.backend": be}), sizes, steps)
    w13 = load_config("wan2.1-t2v-1.3b", [
        "model.num_layers=2", "batch_size=8", "data.num_frames=9", "data.height=128",
        "data.width=128", "data.text_len=64", "data.source=synthetic"])
    for name, sizes, be in meshes:
        # 12 heads: Ulysses needs heads % context == 0, so context=8 uses ring
        if be == "ulysses" and w13.model.num_attention_heads % sizes.get("context", 1):
            be = "ring"
        speed_case(f"1.3b-width-2l/{name}", replace(w13, **{"attention.backend": be}), sizes,
                   steps)


def run_memory(layers):
    base = load_config("wan2.1-t2v-14b", [
        f"model.num_layers={layers}", "model.param_dtype=float32", "model.dtype=bfloat16",
        "batch_size=1"])
    lat = (16, 21, 90, 160)
    text = (512, 4096)
    cases = [("fsdp8", dict(fsdp=8), "blockwise", {}),
             ("context8", dict(context=8), "ulysses", {"attention.local": "blockwise"}),
             ("fsdp2_context4", dict(fsdp=2, context=4), "ulysses",
              {"attention.local": "blockwise"})]
    for name, sizes, be, extra in cases:
        for remat in ("none", "full"):
            mesh = make_mesh({**ONE, **sizes})
            bs = batch_shards(mesh)
            cfg = replace(base, **{"attention.backend": be, "model.remat": remat,
                                   "batch_size": bs, **extra})
            t0 = time.perf_counter()
            try:
                tr = Trainer(cfg, mesh)
                sh = tr.batch_sh
                batch = {"latents": jax.ShapeDtypeStruct((bs,) + lat, jnp.float32,
                                                         sharding=sh["latents"]),
                         "text": jax.ShapeDtypeStruct((bs,) + text, jnp.float32,
                                                      sharding=sh["text"]),
                         "text_mask": jax.ShapeDtypeStruct((bs, text[0]), jnp.uint8,
                                                           sharding=sh["text_mask"])}
                ma = tr.lower(batch).compile().memory_analysis()
                gib = 2 ** 30
                emit(case=f"14b-720p-81f/{name}/remat={remat}", layers=layers, mesh=sizes,
                     backend=be, batch=bs, metric="per_device_memory",
                     value=(ma.argument_size_in_bytes + ma.temp_size_in_bytes
                            + ma.output_size_in_bytes - ma.alias_size_in_bytes) / gib,
                     unit="GiB", arguments_gib=ma.argument_size_in_bytes / gib,
                     temp_gib=ma.temp_size_in_bytes / gib, output_gib=ma.output_size_in_bytes / gib,
                     alias_gib=ma.alias_size_in_bytes / gib,
                     compile_s=time.perf_counter() - t0)
            except Exception as e:  # noqa: BLE001 - report and continue with the next case
                emit(case=f"14b-720p-81f/{name}/remat={remat}", layers=layers, metric="error",
                     value=None, error=f"{type(e).__name__}: {str(e)[:300]}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", default="all", choices=("speed", "memory", "all"))
    p.add_argument("--layers", type=int, default=40, help="14B layers for the memory part")
    p.add_argument("--steps", type=int, default=3)
    a = p.parse_args(argv)
    if a.part in ("memory", "all"):
        run_memory(a.layers)
    if a.part in ("speed", "all"):
        run_speed(a.steps)


if __name__ == "__main__":
    sys.exit(main())
