"""Sequence-parallel exchanges used inside ``jax.shard_map`` (Ulysses all-to-alls, ring step).

Every function here runs per device on the local block and names the mesh axis it talks
over; :func:`context_grid` says which axes those are for a ``ring × ulysses`` split of the
``context`` axis. Letters: b local batch, Lc local tokens (one sequence shard), U shards on
the axis, n local heads, h = n / U heads per shard after the exchange, K head dim.

Three ways to do the same Ulysses exchange (they move identical values):

- ``flat``: one ``all_to_all`` that splits the heads axis and concatenates the token axis
  (and the inverse). Simple; XLA wraps it in relayout copies because neither axis is leading.
- ``chunked``: reshape so the exchanged chunks form a leading ``(U, chunk)`` axis, exchange
  on axis 0 (layout-preserving: each chunk is one contiguous slab), reshape back.
- ``shard_major``: like chunked on the way in, but the result stays in the shard-major
  layout ``[U, b, h, Lc, K]`` that the flash kernel reads and writes, so the output
  exchange is a single leading-axis ``all_to_all`` straight from the kernel's output buffer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec as P

from ditax.parallel.axes import SEQ_AXIS, heads_entry
from ditax.parallel.mesh import BATCH_AXES

RING_AXIS = "context_ring"          # names of the context axis viewed as ring x ulysses
ULYSSES_AXIS = "context_ulysses"


def seq_to_heads_flat(x, axis: str):
    """``[b, Lc, n, K]`` (tokens sharded) → ``[b, U*Lc, h, K]`` (heads sharded)."""
    return jax.lax.all_to_all(x, axis, split_axis=2, concat_axis=1, tiled=True)


def heads_to_seq_flat(x, axis: str):
    """Inverse of :func:`seq_to_heads_flat`: ``[b, U*Lc, h, K]`` → ``[b, Lc, U*h, K]``."""
    return jax.lax.all_to_all(x, axis, split_axis=1, concat_axis=2, tiled=True)


def _a2a_leading(x, axis: str):
    """Exchange slabs ``x[j]`` → device j; result ``[i]`` came from device i."""
    return jax.lax.all_to_all(x, axis, split_axis=0, concat_axis=0, tiled=True)


def seq_to_heads_chunked(x, axis: str, num_shards: int):
    """Same values as :func:`seq_to_heads_flat` through a leading-axis exchange."""
    b, lc, n, k = x.shape
    u = num_shards
    x = jnp.moveaxis(x.reshape(b, lc, u, n // u, k), 2, 0)           # [U(head grp), b, Lc, h, K]
    x = _a2a_leading(x, axis)                                           # [U(seq shard), b, Lc, h, K]
    return jnp.moveaxis(x, 0, 1).reshape(b, u * lc, n // u, k)


def heads_to_seq_chunked(x, axis: str, num_shards: int):
    """Same values as :func:`heads_to_seq_flat` through a leading-axis exchange."""
    b, l, h, k = x.shape
    u = num_shards
    x = jnp.moveaxis(x.reshape(b, u, l // u, h, k), 1, 0)              # [U(seq shard), b, Lc, h, K]
    x = _a2a_leading(x, axis)                                           # [U(head grp), b, Lc, h, K]
    return jnp.moveaxis(x, 0, 2).reshape(b, l // u, u * h, k)


def seq_to_shard_major(x, axis: str, num_shards: int):
    """``[b, Lc, n, K]`` → shard-major ``[U (seq shard), b, h, Lc, K]`` for the flash kernel."""
    b, lc, n, k = x.shape
    u = num_shards
    x = jnp.transpose(x.reshape(b, lc, u, n // u, k), (2, 0, 3, 1, 4))  # [U(head grp), b, h, Lc, K]
    return _a2a_leading(x, axis)


def shard_major_to_seq(o, axis: str):
    """Kernel output ``[U (seq shard), b, h, Lc, K]`` → ``[b, Lc, U*h, K]``.

    The exchange itself reads the kernel's buffer as is (leading axis); only the final
    ``[U, b, h, Lc, K] → [b, Lc, U*h, K]`` is a local transpose into the caller's layout.
    """
    o = _a2a_leading(o, axis)                                           # [U(head grp), b, h, Lc, K]
    u, b, h, lc, k = o.shape
    return jnp.transpose(o, (1, 3, 0, 2, 4)).reshape(b, lc, u * h, k)


def gather_keep(mask, axis: str):
    """Local key mask ``[b, Lc]`` → the mask of the whole exchanged sequence ``[b, U, Lc]``."""
    return jax.lax.all_gather(mask, axis, axis=1, tiled=False)


def ring_shift(tree, axis: str, size: int):
    """Send every leaf to the next device on ``axis`` (i → i+1 mod size) with ``ppermute``."""
    perm = [(i, (i + 1) % size) for i in range(size)]
    return jax.tree.map(lambda x: jax.lax.ppermute(x, axis, perm), tree)


# ---------------------------------------------------------------- the (ring x ulysses) grid


@dataclass(frozen=True)
class ContextGrid:
    """The ``context`` axis viewed as ``ring × ulysses`` devices (R groups of U consecutive).

    ``mesh``: what ``shard_map`` runs over — the mesh itself, or (both R, U > 1) a view whose
    context axis is reshaped into ``(context_ring, context_ulysses)``: the same devices in
    the same order, so arrays sharded over ``context`` need no movement. ``ring_axis`` /
    ``ulysses_axis``: the axis names the ring ``ppermute`` and the Ulysses all-to-alls talk
    over (None when that side has one device).
    """

    mesh: Mesh
    seq: Union[str, tuple[str, str]]
    ring_axis: Optional[str]
    ulysses_axis: Optional[str]

    def token_spec(self) -> P:
        """``[B, L, N, K]``: batch over the batch axes, tokens over the grid, heads over
        ``tensor``."""
        return P(BATCH_AXES, self.seq, heads_entry(self.mesh), None)

    def mask_spec(self) -> P:
        """``[B, L]`` key mask."""
        return P(BATCH_AXES, self.seq)


def context_grid(mesh: Mesh, ring: int, ulysses: int) -> ContextGrid:
    """The :class:`ContextGrid` for ``ring * ulysses == mesh.shape['context']``."""
    if ring > 1 and ulysses > 1:
        names = tuple(mesh.axis_names)
        i = names.index(SEQ_AXIS)
        d = mesh.devices
        view = Mesh(d.reshape(d.shape[:i] + (ring, ulysses) + d.shape[i + 1:]),
                    names[:i] + (RING_AXIS, ULYSSES_AXIS) + names[i + 1:])
        return ContextGrid(view, (RING_AXIS, ULYSSES_AXIS), RING_AXIS, ULYSSES_AXIS)
    return ContextGrid(mesh, SEQ_AXIS, SEQ_AXIS if ring > 1 else None,
                       SEQ_AXIS if ulysses > 1 else None)


__all__ = ["ContextGrid", "context_grid", "seq_to_heads_flat", "heads_to_seq_flat",
           "seq_to_heads_chunked", "heads_to_seq_chunked", "seq_to_shard_major", "shard_major_to_seq", "gather_keep",
           "ring_shift"]
