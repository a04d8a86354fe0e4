"""What the rest of ditax asks of a mesh, without naming its axes.

Model, attention, training and pipeline code call these helpers (or speak logical axes through
:mod:`ditax.parallel.rules`); only ``parallel/`` and the config name ``data``, ``fsdp``,
``context`` and ``tensor``. Every helper accepts ``mesh=None`` (one device: sizes 1).
"""

from __future__ import annotations

from jax.sharding import Mesh

from ditax.parallel.mesh import (
    BATCH_AXES,
    HEADS_AXIS,
    SEQ_AXIS,
    axis_size,
    check_batch,
    check_tensor_split,
)


def batch_shards(mesh: Mesh | None) -> int:
    """How many ways the batch is split (``data * fsdp``)."""
    return axis_size(mesh, BATCH_AXES)


def seq_shards(mesh: Mesh | None) -> int:
    """How many ways the token sequence is split (``context``)."""
    return axis_size(mesh, SEQ_AXIS)


def head_shards(mesh: Mesh | None) -> int:
    """How many ways heads / MLP columns are split (``tensor``)."""
    return axis_size(mesh, HEADS_AXIS)


def _used(mesh: Mesh | None, axes):
    if mesh is None:
        return None
    used = tuple(a for a in axes if mesh.shape.get(a, 1) > 1)
    if not used:
        return None
    return used[0] if len(used) == 1 else used


def batch_entry(mesh: Mesh | None):
    """The ``PartitionSpec`` entry of a batch dimension: the batch axes of size > 1, or None."""
    return _used(mesh, BATCH_AXES)


def seq_entry(mesh: Mesh | None):
    """The ``PartitionSpec`` entry of a sequence dimension (``context`` when > 1, else None)."""
    return _used(mesh, (SEQ_AXIS,))


def heads_entry(mesh: Mesh | None):
    """The ``PartitionSpec`` entry of a heads dimension (``tensor`` when > 1, else None)."""
    return _used(mesh, (HEADS_AXIS,))


def _sizes(mesh: Mesh | None) -> dict[str, int]:
    return {} if mesh is None else dict(mesh.shape)


def check_batch_divides(batch: int, mesh: Mesh | None, what: str = "batch",
                        fix: str | None = None) -> None:
    """:class:`~ditax.errors.ConfigError` unless ``batch`` splits over the batch shards
    (the one message of :func:`ditax.parallel.mesh.check_batch`; ``fix`` replaces its advice)."""
    check_batch(batch, _sizes(mesh), what, fix)


def check_heads_divide(num_heads: int, mesh: Mesh | None,
                       what: str = "model.num_attention_heads") -> None:
    """:class:`~ditax.errors.ConfigError` unless ``num_heads`` splits over the head shards;
    ``what`` names the quantity in the message (``{what}={num_heads} is not divisible ...``)."""
    check_tensor_split(num_heads, _sizes(mesh), what)


__all__ = ["SEQ_AXIS", "HEADS_AXIS", "batch_shards", "seq_shards", "head_shards", "batch_entry",
           "seq_entry", "heads_entry", "check_batch_divides", "check_heads_divide"]
