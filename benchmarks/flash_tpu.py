"""Deviceless TPU v6e compile of attention forward+backward (issue 11 item 4): ditax's
``flash`` (Pallas forward + Pallas dq / dk-dv kernels) next to ``blockwise`` (the jnp
recompute backward flash used before), on one v6e device. Prints one JSON line per case:
compile time, per-device memory (memory_analysis), relayout copies, Mosaic kernels, FLOPs.

  PYTHONPATH=src python benchmarks/flash_tpu.py [--L 8192] [--N 8] [--K 128] [--block 512]

Needs libtpu (``pip install "jax[tpu]==<jax version>"``). Kept out of CI: each compile takes
seconds to minutes on 2 cores.
"""

import argparse
import json
import os
import re
import time

os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import topologies  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

from ditax import target_platform  # noqa: E402
from ditax.attention import attend  # noqa: E402

BYTES = {"bf16": 2, "f16": 2, "f32": 4, "s32": 4, "u32": 4, "pred": 1, "s8": 1, "u8": 1}


def copies(hlo: str) -> tuple[int, int]:
    """(number, bytes) of ``copy`` ops in optimised HLO text."""
    n = b = 0
    for m in re.finditer(r"= (\w+)\[([\d,]*)\]\{[^}]*\} copy\(", hlo):
        n += 1
        b += BYTES.get(m.group(1), 4) * int(np.prod([int(x) for x in m.group(2).split(",") if x]
                                                    or [1]))
    return n, b


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--L", type=int, default=8192)
    ap.add_argument("--N", type=int, default=8)
    ap.add_argument("--K", type=int, default=128)
    ap.add_argument("--block", type=int, default=512)
    a = ap.parse_args()
    topo = topologies.get_topology_desc(platform="tpu", topology_name="v6e:2x4")
    mesh = Mesh(np.array(topo.devices[:1]), ("x",))
    x = jax.ShapeDtypeStruct((1, a.L, a.N, a.K), jnp.bfloat16, sharding=NamedSharding(mesh, P()))

    for backend in ("flash", "blockwise"):
        def grads(q, k, v, backend=backend):
            def loss(q, k, v):
                o = attend(q, k, v, backend=backend, block_q=a.block, block_kv=a.block)
                return jnp.sum(o.astype(jnp.float32))
            return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

        t = time.perf_counter()
        with target_platform("tpu"):
            c = jax.jit(grads).lower(x, x, x).compile()
        hlo, ma = c.as_text(), c.memory_analysis()
        ca = c.cost_analysis()
        ca = ca[0] if isinstance(ca, list) else ca
        n, b = copies(hlo)
        print(json.dumps({
            "bench": "flash_tpu", "case": f"fwd_bwd L={a.L} N={a.N} K={a.K} block={a.block}",
            "backend": backend, "chip": "v6e", "compile_s": round(time.perf_counter() - t, 1),
            "temp_bytes": ma.temp_size_in_bytes, "argument_bytes": ma.argument_size_in_bytes,
            "copy_ops": n, "copy_bytes": b,
            "tpu_custom_calls": hlo.count('custom_call_target="tpu_custom_call"'),
            "flops": ca.get("flops")}), flush=True)


if __name__ == "__main__":
    main()
