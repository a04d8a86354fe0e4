"""Per-step sparsity schedules (``attention.dense_steps=k``): the first ``k`` denoising steps of
a call run the model with dense attention, the rest with its block-sparse attention
(``attention.sparsity``), as sliding-tile and radial attention do — the early, noisy steps lay
out the video's structure and are the ones a sparse mask harms.

The switch is a second expert: for an :class:`~ditax.pipelines.sampling.Expert` whose model
has a sparsity and ``dense_steps > 0``, :func:`dense_twin` is the same parameters under a graph
whose attention config says ``sparsity=none`` (the model's attention plan is unchanged: the
sparsity keys are no kernel's option). The loop keys its compiled programs by expert graph, so
a call compiles exactly two step programs (dense, sparse), each once, and every step calls
one of them; :func:`schedule` says which expert runs each step (a continuous batch groups its
rows by it, :mod:`ditax.pipelines.continuous`). Nothing is recompiled per step and no
parameter is copied. A step cache is refused with dense steps (its residuals would cross the
switch).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ditax.errors import RequestError


def _sparse_modules(module):
    """The modules in ``module``'s graph whose attention config has a sparsity."""
    from flax import nnx

    from ditax.attention.config import AttentionConfig

    return [node for _, node in nnx.iter_graph(module)
            if isinstance(getattr(node, "attention", None), AttentionConfig)
            and node.attention.sparsity != "none"]


def _densify(nodes) -> None:
    for n in nodes:
        n.attention = dataclasses.replace(n.attention, sparsity="none", dense_steps=0,
                                          topk=0, vsa_fine="gather", vsa_group=0)


def dense_graph(graphdef, *states):
    """The graphdef of the module ``nnx.merge(graphdef, *states)`` (``states`` may be abstract)
    with every sparse attention config made dense: the same parameters and paths (a ``vsa``
    model's gates stay, unused), so ``nnx.merge(dense_graph(g, *s), *s)`` runs the module's
    dense twin; None when the module has no sparsity. DMD2 with a sparse student runs its
    teacher and critic so (:mod:`ditax.train.distill`)."""
    from flax import nnx

    module = nnx.merge(graphdef, *states)
    nodes = _sparse_modules(module)
    if not nodes:
        return None
    _densify(nodes)
    return nnx.split(module)[0]


def dense_twin(expert):
    """``(k, twin)``: the expert's ``dense_steps`` and its dense twin (module docstring), or
    ``(0, None)`` when its model has no sparsity or no dense steps."""
    from flax import nnx

    module = nnx.merge(expert.graphdef, expert.params)
    nodes = _sparse_modules(module)
    steps = {n.attention.dense_steps for n in nodes}
    if not nodes or steps == {0}:
        return 0, None
    if len(steps) > 1:
        raise RequestError(f"the denoiser's modules disagree on attention.dense_steps "
                           f"({sorted(steps)}); give them one value")
    _densify(nodes)
    graphdef, _ = nnx.split(module)
    return steps.pop(), dataclasses.replace(expert, graphdef=graphdef)


def schedule(per_step: Sequence) -> list:
    """``per_step`` (the expert of each step of a call, in order) with each expert that has
    dense steps replaced by its dense twin on the call's first ``dense_steps`` steps (one twin
    per expert, built once)."""
    twins: dict[int, tuple] = {}
    out = []
    for i, e in enumerate(per_step):
        if id(e) not in twins:
            twins[id(e)] = dense_twin(e)
        k, twin = twins[id(e)]
        out.append(twin if twin is not None and i < k else e)
    return out


__all__ = ["dense_graph", "dense_twin", "schedule"]
