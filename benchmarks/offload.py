"""Host offload's time cost on CPU: one JSON object per line,

    {"bench": "offload", "case": ..., "metric": ..., "value": ..., "unit": ..., ...}

The shipped demo transformer (``ditax.demo.model_path()``), one forward at ``--latent`` and
``--batch``, resident and with ``model.offload=host`` (``offload_prefetch`` 0 and 1), each
compiled once and timed ``--repeats`` times: the median seconds and their ratio to the
resident forward, side by side in one run. Also the bytes the offloaded model keeps in host
memory. On CPU host and device memory are the same RAM, so this measures what the per-layer
programme itself costs (slicing the stack by layer index instead of ``nnx.scan``, the carried
prefetch), not a transfer; the transfers on paper are ``ditax plan --fit``'s
(docs/plan_big_models.md).

    python benchmarks/offload.py [--latent 3,16,16] [--batch 2] [--repeats 9] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from bench_lines import append


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--latent", default="3,16,16", help="latent frames,height,width")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--out", default=None, help="also append the lines to this file")
    a = p.parse_args(argv)

    import jax
    import jax.numpy as jnp
    import numpy as np

    import ditax
    from ditax.demo import model_path
    from ditax.nn.offload import host_bytes

    f, y, x = (int(v) for v in a.latent.split(","))
    lines = []

    def emit(case, metric, value, unit, **extra):
        row = {"bench": "offload", "case": case, "metric": metric, "value": value,
               "unit": unit, "platform": jax.devices()[0].platform, **extra}
        lines.append(row)
        print(json.dumps(row), flush=True)

    root = model_path()
    runs = {"resident": {}, "offload_prefetch0": dict(offload="host", offload_prefetch=0),
            "offload_prefetch1": dict(offload="host", offload_prefetch=1)}
    times = {}
    for name, kw in runs.items():
        tr = ditax.load_transformer(root, **kw)
        cfg = tr.config
        rng = np.random.default_rng(0)
        lat = jnp.asarray(rng.standard_normal((a.batch, cfg.in_channels, f, y, x)), jnp.float32)
        t = jnp.full((a.batch,), 500.0)
        text = jnp.asarray(rng.standard_normal((a.batch, 64, cfg.text_dim)), jnp.float32)
        fwd = jax.jit(lambda m, lat, t, text: m(lat, t, text))
        jax.block_until_ready(fwd(tr, lat, t, text))           # compile
        ts = []
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(fwd(tr, lat, t, text))
            ts.append(time.perf_counter() - t0)
        times[name] = statistics.median(ts)
        case = f"demo_wan_b{a.batch}_latent{f}x{y}x{x}"
        emit(case, f"{name}_forward_median", times[name], "s", repeats=a.repeats)
        emit(case, f"{name}_host_bytes", host_bytes(jax.tree.leaves(tr)), "bytes")
    for name in runs:
        if name != "resident":
            emit(f"demo_wan_b{a.batch}_latent{f}x{y}x{x}", f"{name}_vs_resident",
                 times[name] / times["resident"], "ratio")
    append(lines, a.out)


if __name__ == "__main__":
    main()
