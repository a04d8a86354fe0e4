"""Logical axis names → mesh axes. One table for parameters, one for activations.

Model code names axes logically (DESIGN rule 2); only this module knows mesh axes.

Parameters: ``embed`` is sharded over ``fsdp`` and ``context`` (ZeRO-3 over every device that
sees different data for the same weights), ``heads``/``mlp`` over ``tensor``.
Activations: batch over ``(data, fsdp)``, sequence over ``context``, heads/MLP over ``tensor``.
"""

from __future__ import annotations

from typing import Sequence

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

PARAM_RULES: dict[str, tuple[str, ...] | None] = {
    "layers": None,
    "embed": ("fsdp", "context"),
    "heads": ("tensor",),
    "mlp": ("tensor",),
    "vocab": ("tensor",),
    "in_channels": None,
    "out_channels": None,
    "freq": None,
    "modulation": None,
    "norm": None,
    "kernel_t": None,
    "kernel_h": None,
    "kernel_w": None,
    "text_embed": ("fsdp", "context"),
}

ACTIVATION_RULES: dict[str, tuple[str, ...] | None] = {
    "act_batch": ("data", "fsdp"),
    "act_seq": ("context",),
    "act_text": None,
    "act_heads": ("tensor",),
    "act_kv": None,
    "act_embed": None,
    "act_mlp": ("tensor",),
    "act_channels": None,
}


def _entry(axes, mesh: Mesh | None, dim: int | None, drop_nondividing: bool):
    if axes is None:
        return None
    if mesh is not None:
        axes = tuple(a for a in axes if mesh.shape.get(a, 1) > 1)
        if drop_nondividing and dim is not None:
            kept = []
            prod = 1
            for a in axes:
                if dim % (prod * mesh.shape[a]) == 0:
                    kept.append(a)
                    prod *= mesh.shape[a]
            axes = tuple(kept)
    if not axes:
        return None
    return axes[0] if len(axes) == 1 else axes


def logical_to_spec(names: Sequence[str | None], rules: dict, mesh: Mesh | None = None,
                    shape: Sequence[int] | None = None, drop_nondividing: bool = False) -> P:
    """PartitionSpec for logical ``names`` under ``rules``.

    With ``drop_nondividing`` (parameters), a mesh axis that does not divide the dimension is
    dropped for that dimension (the tensor is replicated along it) — e.g. a bias of size 6 on
    an fsdp=8 mesh. Activations are validated up front instead and never silently replicated.
    """
    used: set[str] = set()
    entries = []
    for i, n in enumerate(names):
        if n is None:
            entries.append(None)
            continue
        if n not in rules:
            raise KeyError(f"logical axis {n!r} has no rule; known: {sorted(rules)}")
        axes = rules[n]
        if axes is not None:
            axes = tuple(a for a in axes if a not in used)
        e = _entry(axes, mesh, None if shape is None else shape[i], drop_nondividing)
        if e is not None:
            used.update((e,) if isinstance(e, str) else e)
        entries.append(e)
    return P(*entries)


def param_spec(names, mesh: Mesh | None = None, shape=None) -> P:
    return logical_to_spec(names, PARAM_RULES, mesh, shape, drop_nondividing=True)


def activation_spec(names, mesh: Mesh | None = None) -> P:
    return logical_to_spec(names, ACTIVATION_RULES, mesh)


def constrain(x: jax.Array, names, mesh: Mesh | None):
    """``with_sharding_constraint`` on logical activation names; a no-op without a mesh."""
    if mesh is None:
        return x
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, activation_spec(names, mesh)))
