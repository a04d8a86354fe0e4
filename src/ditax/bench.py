"""Forward time of a config with random weights (what ``ditax bench`` prints).

One median over ``repeats`` runs after a compile run, on the mesh's devices, with the mesh and
attention backend from the config. For comparisons against a peer use the scripts in
``benchmarks/``.
"""

from __future__ import annotations

import statistics
import time


def forward_benchmark(cfg, mesh, latent=None, text_len: int = 512, repeats: int = 5,
                      after=None, transformer=None) -> dict:
    """Time the family's inference transformer (randomly initialised; or ``transformer``, one
    already loaded, e.g. by :func:`ditax.load_transformer`) on the family's random
    inputs (:meth:`~ditax.models.base.ModelFamily.random_inputs`): ``B`` = the mesh's batch
    shards samples of latent grid ``latent = (F, Y, X)`` (None: the family's default; Wan:
    latents ``[B, C, F, Y, X]``, Flux: packed tokens of one frame) and ``text_len`` text
    tokens. Returns one benchmark row (DESIGN "Benchmarks"); ``latent`` in it is the shape of
    the transformer's first input; ``init_s`` the random initialisation's seconds (its
    compile and draw; absent for a given ``transformer``). ``after(call)``, when given, is
    called once the timing is done with ``call()`` running one more forward to completion
    (e.g. to profile it); what it returns is the row's ``"after"``."""
    from ditax.errors import RequestError
    from ditax.models.base import model_family

    if not (isinstance(repeats, int) and repeats >= 1):    # a median of no runs is no number
        raise RequestError(f"--repeats {repeats}: time at least 1 run after the compile run")
    if not (isinstance(text_len, int) and text_len >= 1):
        raise RequestError(f"--text-len {text_len}: the text needs at least 1 token")

    import jax

    args, kwargs = forward_inputs(cfg, mesh, latent, text_len)
    tr, init = transformer, {}
    if tr is None:
        t0 = time.perf_counter()
        tr = model_family(cfg.model, cfg.attention).random_transformer(mesh, seed=cfg.seed)
        jax.block_until_ready(jax.tree.leaves(tr))
        init = {"init_s": round(time.perf_counter() - t0, 2)}
    t0 = time.perf_counter()
    jax.block_until_ready(tr(*args, **kwargs))
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(tr(*args, **kwargs))
        times.append(time.perf_counter() - t0)
    row = {"bench": "ditax_bench", "case": cfg.name, "metric": "forward",
           "value": statistics.median(times), "unit": "s", "compile_plus_first_s": first,
           **init,
           "mesh": dict(mesh.shape), "attention": cfg.attention.backend,
           "latent": list(args[0].shape), "platform": mesh.devices.flat[0].platform}
    a = cfg.attention
    if a.sparsity != "none":
        row["sparsity"] = {"mode": a.sparsity, "tile": _tile(a, cfg.model, args[0].shape),
                           "window": list(a.window)}
        if a.sparsity == "radial":
            row["sparsity"]["decay"] = a.decay
        if a.sparsity == "vsa":
            row["sparsity"]["topk"] = a.topk
            row["sparsity"]["vsa_fine"] = a.vsa_fine
            if a.vsa_group:
                row["sparsity"]["vsa_group"] = a.vsa_group
    if after is not None:
        row["after"] = after(lambda: jax.block_until_ready(tr(*args, **kwargs)))
    return row


def forward_inputs(cfg, mesh, latent=None, text_len: int = 512):
    """``(args, kwargs)`` of the timed call: the family's random inputs
    (:meth:`~ditax.models.base.ModelFamily.random_inputs`, numpy seed 0) for the mesh's batch
    shards; the same inputs at every call."""
    import numpy as np

    from ditax.models.base import model_family
    from ditax.parallel.axes import batch_shards

    family = model_family(cfg.model, cfg.attention)
    return family.random_inputs(batch_shards(mesh), latent, text_len, np.random.default_rng(0))


def _tile(acfg, model, latent_shape) -> list:
    """The tile the model ran: ``attention.tile`` as given, ``auto`` resolved for the patched
    grid of ``latent_shape [B, C, F, H, W]`` (kept as ``auto`` for a model without patches)."""
    if acfg.tile != "auto":
        return list(acfg.tile)
    from ditax.attention.sparse.layout import latent_layout_summary

    summary = latent_layout_summary(acfg, model, latent_shape)
    return acfg.tile if summary is None else summary["tile"]
