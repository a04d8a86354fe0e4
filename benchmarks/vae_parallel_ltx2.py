"""Per-device memory of LTX-2's video VAE decode, one device vs row-split over a v6e-8 slice.

Compiles (deviceless: libtpu, no TPU attached, ``TPU_SKIP_MDS_QUERY=1``) the decode of a
768x512 video of 121 frames (latents ``[1, 128, 16, Y=16, X=24]``) with LTX-2's VAE (diffusers'
``AutoencoderKLLTX2Video`` defaults as its LTX-2.0 conversion sets them: 128 latent channels, 32x / 8x, three residual
spatio-temporal decoder levels, reflection padding; non-causal decoder as the checkpoint) and
abstract weights, once on one v6e device (``LTX2VideoVAE.decode`` untiled: the whole clip in
one program) and once with every frame's rows split over the 8 devices of ``v6e:2x4``
(:mod:`ditax.models.vae.ltx2_parallel`), and prints one JSON line per program and a summary
line with the ratio (docs/vae_parallel_ltx2_v6e8.jsonl: per-device temp 1.29 GB vs 8.71 GB, 0.148x).
Usage: ``python benchmarks/vae_parallel_ltx2.py [--frames 121] [--out FILE]``.
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

from ditax.models.vae import ltx2_parallel  # noqa: E402
from ditax.models.vae.ltx2 import LTX2VideoVAE, LTX2VideoVAEConfig  # noqa: E402
from ditax.models.vae.ltx2.model import decode_program  # noqa: E402
from ditax.models.vae.rowsplit import make_split, row_spec  # noqa: E402
from ditax.parallel.platform import target_platform  # noqa: E402
from ditax.plan.measure import memory  # noqa: E402


def _abstract(state, mesh):
    rep = NamedSharding(mesh, P())
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=rep), state)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--height", type=int, default=512)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--frames", type=int, default=121)
    ap.add_argument("--out", default=None, help="also append the JSON lines to this file")
    a = ap.parse_args()
    dtype = jnp.dtype(a.dtype)
    cfg = LTX2VideoVAEConfig(decoder_causal=False, spatial_compression_ratio=32,
                             temporal_compression_ratio=8)   # LTX-2.0's vae/config.json
    vae = nnx.eval_shape(lambda: LTX2VideoVAE(cfg, dtype=dtype, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(vae)
    s, tf = vae.spatial_compression_ratio, vae.temporal_compression_ratio
    y, x, f = a.height // s, a.width // s, (a.frames - 1) // tf + 1
    c = cfg.latent_channels
    devices = topologies.get_topology_desc(platform="tpu", topology_name="v6e:2x4").devices
    base = dict(bench="vae_parallel", model="ltx2-video-vae", chip="v6e", dtype=a.dtype,
                video=f"{a.frames}x{a.height}x{a.width}", latents=[1, c, f, y, x])

    def emit(d):
        bench_lines.emit({**base, **d}, a.out)

    def run(case, lowered):
        t = time.perf_counter()
        mem = memory(lowered.compile())
        emit(dict(case=case, program="whole clip", compile_s=round(time.perf_counter() - t, 1),
                  **mem))
        return mem

    with target_platform("tpu"):
        one = Mesh(np.array(devices[:1]), ("d",))
        z1 = jax.ShapeDtypeStruct((1, f, y, x, c), dtype, sharding=NamedSharding(one, P()))
        m1 = run("1 device", decode_program.lower(graphdef, _abstract(state, one), z1, None))
        mesh = Mesh(np.array(devices), ("d",))
        split = make_split(mesh, y, "benchmark")
        rows = split.devices * split.local_rows
        z8 = jax.ShapeDtypeStruct((1, f, rows, x, c), dtype,
                                  sharding=NamedSharding(mesh, row_spec(split, 2, 5)))
        m8 = run(f"8 devices row-split ({split.local_rows} of {rows} latent rows each)",
                 ltx2_parallel.decode_program.lower(graphdef, _abstract(state, mesh), z8, None,
                                                    mesh=mesh, split=split))
    emit(dict(case="summary", metric="per-device temp ratio 8 devices / 1 device",
              value=round(m8["temp_bytes"] / m1["temp_bytes"], 4) if m1["temp_bytes"] else None,
              temp_bytes_1=m1["temp_bytes"], temp_bytes_8=m8["temp_bytes"],
              peak_bytes_1=m1["peak_bytes"], peak_bytes_8=m8["peak_bytes"],
              peak_ratio=round(m8["peak_bytes"] / m1["peak_bytes"], 4)))


if __name__ == "__main__":
    main()
