"""Forward time of a config with random weights (what ``ditax bench`` prints).

One median over ``repeats`` runs after a compile run, on the mesh's devices, with the mesh and
attention backend from the config. For comparisons against a peer use the scripts in
``benchmarks/``.
"""

from __future__ import annotations

import statistics
import time


def forward_benchmark(cfg, mesh, latent=(5, 32, 32), text_len: int = 512,
                      repeats: int = 5) -> dict:
    """Time the transformer forward on random inputs: latents ``[B, C, F, Y, X]`` with
    ``(F, Y, X) = latent`` and ``B`` = the mesh's batch shards, text ``[B, T, text_dim]`` with
    ``T = text_len``. Returns one benchmark row (DESIGN "Benchmarks")."""
    from ditax.errors import RequestError

    if not (isinstance(repeats, int) and repeats >= 1):    # a median of no runs is no number
        raise RequestError(f"--repeats {repeats}: time at least 1 run after the compile run")
    if not (isinstance(text_len, int) and text_len >= 1):
        raise RequestError(f"--text-len {text_len}: the text needs at least 1 token")

    import jax
    import jax.numpy as jnp
    import numpy as np

    from ditax.models.base import model_family
    from ditax.parallel.axes import batch_shards

    f, y, x = latent
    b = batch_shards(mesh)
    # the family's inference transformer, randomly initialised (Wan: ditax.Transformer)
    tr = model_family(cfg.model, cfg.attention).random_transformer(mesh, seed=cfg.seed)
    rng = np.random.default_rng(0)
    dt = jnp.dtype(cfg.model.dtype)
    lat = jnp.asarray(rng.standard_normal((b, cfg.model.in_channels, f, y, x)), dt)
    text = jnp.asarray(rng.standard_normal((b, text_len, cfg.model.text_dim)), dt)
    t = jnp.full((b,), 500.0)
    t0 = time.perf_counter()
    jax.block_until_ready(tr(lat, t, text))
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(tr(lat, t, text))
        times.append(time.perf_counter() - t0)
    return {"bench": "ditax_bench", "case": cfg.name, "metric": "forward",
            "value": statistics.median(times), "unit": "s", "compile_plus_first_s": first,
            "mesh": dict(mesh.shape), "attention": cfg.attention.backend,
            "latent": [b, cfg.model.in_channels, f, y, x],
            "platform": mesh.devices.flat[0].platform}
