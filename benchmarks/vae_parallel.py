"""Per-device memory of the Wan 2.1 VAE decode, one device vs row-split over a v6e-8 slice.

Compiles (deviceless: libtpu, no TPU attached, ``TPU_SKIP_MDS_QUERY=1``) the decode of a
720p video (latents ``[1, 16, 21, Y=90, X=160]`` → 81 frames of 720x1280) with the real Wan 2.1
VAE config and abstract weights, once on one v6e device (:mod:`ditax.models.vae.wan.chunks`,
what ``WanVAE.decode`` runs) and once with every frame's rows split over the 8 devices of
``v6e:2x4`` (:mod:`ditax.models.vae.wan_parallel`), and prints one JSON line per program and
a summary line with the ratio.

The decode is clip-by-clip in both (as ditax always decodes a Wan video): a program for the
first latent frame and one for every later frame, which is called 20 times for 81 frames and
carries the feature cache (an argument and donated output, not temp). The whole decode's peak
is therefore the larger of the two programs', whatever the frame count: the later-frame
program's (4 output frames; the first makes 1), which is what is compiled and compared
(``--first`` compiles the first-frame program too). Usage: ``python benchmarks/vae_parallel.py [--dtype bfloat16] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import bench_lines  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from jax.experimental import topologies  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from ditax.models.vae import wan_parallel  # noqa: E402
from ditax.models.vae.rowsplit import make_split, row_spec  # noqa: E402
from ditax.models.vae.wan import WanVAE, WanVAEConfig  # noqa: E402
from ditax.models.vae.wan.chunks import decode_chunk  # noqa: E402
from ditax.parallel.platform import target_platform  # noqa: E402
from ditax.plan.measure import memory  # noqa: E402

HEIGHT, WIDTH, FRAMES = 720, 1280, 81


def _abstract(vae_state, mesh):
    rep = NamedSharding(mesh, P())
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=rep), vae_state)


def _programs(lower, chunk, emit, case, with_first: bool):
    """Compile the later-frame program (and the first-frame one with ``with_first``); emit one
    line each; the largest of their memory figures."""
    out = []
    first = lower(chunk, None, True)
    cache = first.out_info[1]  # lowering is cheap; the cache's shapes come from it
    todo = ([("first", first)] if with_first else []) + [("rest", lower(chunk, cache, False))]
    for name, lowered in todo:
        t = time.perf_counter()
        compiled = lowered.compile()
        mem = memory(compiled)
        emit(dict(case=case, program=name, compile_s=round(time.perf_counter() - t, 1), **mem))
        out.append(mem)
    return {k: max(m[k] for m in out) for k in out[0]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--out", default=None, help="also append the JSON lines to this file")
    ap.add_argument("--first", action="store_true",
                    help="also compile the first-frame program (1 output frame instead of the "
                         "later frames' 4, so smaller; off by default: TPU compiles of the "
                         "full-size decoder take minutes on a small CPU)")
    a = ap.parse_args()
    dtype = jnp.dtype(a.dtype)
    cfg = WanVAEConfig()  # Wan 2.1: base 96, z 16, dims 1-2-4-4, 2 res blocks, 8x / 4x
    vae = nnx.eval_shape(lambda: WanVAE(cfg, dtype=dtype, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(vae)
    y, x = HEIGHT // cfg.spatial_factor, WIDTH // cfg.spatial_factor
    latent_frames = (FRAMES - 1) // cfg.temporal_factor + 1
    devices = topologies.get_topology_desc(platform="tpu", topology_name="v6e:2x4").devices
    base = dict(bench="vae_parallel", model="wan2.1-vae", chip="v6e", dtype=a.dtype,
                video=f"{FRAMES}x{HEIGHT}x{WIDTH}", latents=[1, cfg.z_dim, latent_frames, y, x])

    def emit(d):
        bench_lines.emit({**base, **d}, a.out)

    with target_platform("tpu"):
        one = Mesh(np.array(devices[:1]), ("d",))
        st1 = _abstract(state, one)
        chunk1 = jax.ShapeDtypeStruct((1, 1, y, x, cfg.z_dim), dtype, sharding=NamedSharding(one, P()))
        m1 = _programs(lambda c, cache, first: decode_chunk.lower(graphdef, st1, c, cache, first=first),
                       chunk1, emit, "1 device", a.first)

        mesh = Mesh(np.array(devices), ("d",))
        split = make_split(mesh, y, "benchmark")
        st8 = _abstract(state, mesh)
        rows = split.devices * split.local_rows
        chunk8 = jax.ShapeDtypeStruct((1, 1, rows, x, cfg.z_dim), dtype,
                                      sharding=NamedSharding(mesh, row_spec(split, 2, 5)))
        m8 = _programs(lambda c, cache, first: wan_parallel.decode_chunk.lower(
            graphdef, st8, c, cache, first=first, mesh=mesh, split=split),
            chunk8, emit, f"8 devices row-split ({split.local_rows} of {rows} padded latent rows each)",
            a.first)

    emit(dict(case="summary", metric="per-device temp ratio 8 devices / 1 device",
              value=round(m8["temp_bytes"] / m1["temp_bytes"], 4),
              temp_bytes_1=m1["temp_bytes"], temp_bytes_8=m8["temp_bytes"],
              peak_bytes_1=m1["peak_bytes"], peak_bytes_8=m8["peak_bytes"],
              peak_ratio=round(m8["peak_bytes"] / m1["peak_bytes"], 4)))


if __name__ == "__main__":
    main()
