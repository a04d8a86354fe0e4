"""``ditax bench CONFIG [key=value ...]``: forward time of a config with random weights.

Prints one JSON line (median of ``--repeats`` runs after a compile run) on whatever devices
JAX sees, with the mesh and attention backend from the config. For comparisons against a peer
use the scripts in ``benchmarks/``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def add_arguments(p: argparse.ArgumentParser):
    p.add_argument("config")
    p.add_argument("overrides", nargs="*")
    p.add_argument("--latent", default="5,32,32", help="latent F,Y,X (default 5,32,32)")
    p.add_argument("--text-len", type=int, default=512)
    p.add_argument("--repeats", type=int, default=5)


def run(args) -> int:
    import jax

    from ditax.attention.te import entry_context
    from ditax.config import load_config, validate
    from ditax.parallel import make_mesh

    cfg = load_config(args.config, args.overrides)
    validate(cfg, jax.device_count())
    mesh = make_mesh(cfg.mesh)

    with entry_context(cfg.attention, mesh):
        return _run(args, cfg, mesh)


def _run(args, cfg, mesh) -> int:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from ditax.models.wan.loading import Transformer, init_model
    from ditax.parallel.axes import batch_shards

    f, y, x = (int(v) for v in args.latent.split(","))
    b = batch_shards(mesh)
    tr = Transformer(init_model(cfg.model, cfg.attention, mesh, seed=cfg.seed), mesh)
    rng = np.random.default_rng(0)
    dt = jnp.dtype(cfg.model.dtype)
    lat = jnp.asarray(rng.standard_normal((b, cfg.model.in_channels, f, y, x)), dt)
    text = jnp.asarray(rng.standard_normal((b, args.text_len, cfg.model.text_dim)), dt)
    t = jnp.full((b,), 500.0)
    t0 = time.perf_counter()
    jax.block_until_ready(tr(lat, t, text))
    first = time.perf_counter() - t0
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(tr(lat, t, text))
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    print(json.dumps({"bench": "ditax_bench", "case": cfg.name, "metric": "forward", "value": med,
                      "unit": "s", "compile_plus_first_s": first, "mesh": dict(mesh.shape),
                      "attention": cfg.attention.backend, "latent": [b, cfg.model.in_channels,
                                                                     f, y, x],
                      "platform": jax.devices()[0].platform}))
    return 0
