"""What the rest of ditax asks of a mesh, without naming its axes.

Model, attention, training and pipeline code call these helpers (or speak logical axes through
:mod:`ditax.parallel.rules`); only ``parallel/`` and the config name ``data``, ``fsdp``,
``context`` and ``tensor``. Every helper accepts ``mesh=None`` (one device: sizes 1).
"""

from __future__ import annotations

from jax.sharding import Mesh

from ditax.parallel.mesh import BATCH_AXES, axis_size

SEQ_AXIS = "context"      # the sequence-parallel axis (Ulysses / ring)
HEADS_AXIS = "tensor"     # heads / MLP columns


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


def check_batch_divides(batch: int, mesh: Mesh | None, what: str = "batch") -> None:
    """``ValueError`` unless ``batch`` splits over ``data * fsdp`` (message names the fix)."""
    n = batch_shards(mesh)
    if batch % n:
        raise ValueError(
            f"{what} {batch} is not divisible by mesh data*fsdp = {n}; use a batch that is a "
            f"multiple of {n}, or put the devices on mesh.context for one video")


def check_heads_divide(num_heads: int, mesh: Mesh | None, what: str = "attention") -> None:
    """``ValueError`` unless ``num_heads`` splits over ``tensor``."""
    t = head_shards(mesh)
    if num_heads % t:
        raise ValueError(f"{what}: {num_heads} heads are not divisible by mesh tensor={t}; "
                         f"choose a tensor size dividing {num_heads}")


__all__ = ["SEQ_AXIS", "HEADS_AXIS", "batch_shards", "seq_shards", "head_shards", "batch_entry",
           "seq_entry", "heads_entry", "check_batch_divides", "check_heads_divide"]
