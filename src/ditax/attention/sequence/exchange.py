"""The Ulysses exchanges on head-major activations ``[b, n, Lc, K]`` (per device, inside
``shard_map``), as a model's projections write them for the TPU kernels.

The token-major ``[b, Lc, n, K]`` forms live in :mod:`ditax.parallel.collectives`; these move
the same values. Letters as there: b local batch, Lc local tokens, U shards on the axis,
n local heads, h = n / U heads per shard after the exchange, K head dim.

- ``flat``: one ``all_to_all`` splitting heads (axis 1) and concatenating tokens (axis 2);
- ``chunked``: a leading-axis exchange of ``[U, b, h, Lc, K]`` slabs, reshaped around it;
- ``shard_major``: the leading-axis exchange, the result left ``[U, b, h, Lc, K]`` (what the
  flash kernel reads and writes). Splitting the heads into ``(U, h)`` is free (a major dim);
  moving ``U`` in front of ``b`` is free for ``b = 1`` (a video per device), a copy otherwise.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _a2a(x, axis: str, split: int, concat: int):
    return jax.lax.all_to_all(x, axis, split_axis=split, concat_axis=concat, tiled=True)


def to_heads_flat(x, axis: str):
    """``[b, n, Lc, K]`` (tokens sharded) → ``[b, h, U·Lc, K]`` (heads sharded)."""
    return _a2a(x, axis, 1, 2)


def from_heads_flat(x, axis: str):
    """Inverse of :func:`to_heads_flat`: ``[b, h, U·Lc, K]`` → ``[b, U·h, Lc, K]``."""
    return _a2a(x, axis, 2, 1)


def to_shard_major(x, axis: str, num_shards: int):
    """``[b, n, Lc, K]`` → ``[U (seq shard), b, h, Lc, K]``."""
    b, n, lc, k = x.shape
    x = jnp.moveaxis(x.reshape(b, num_shards, n // num_shards, lc, k), 1, 0)
    return _a2a(x, axis, 0, 0)                                  # [U(head grp)] -> [U(seq)]


def from_shard_major(o, axis: str):
    """``[U (seq shard), b, h, Lc, K]`` → ``[b, U·h, Lc, K]`` (inverse of
    :func:`to_shard_major`)."""
    o = _a2a(o, axis, 0, 0)                                     # [U(head grp), b, h, Lc, K]
    u, b, h, lc, k = o.shape
    return jnp.moveaxis(o, 0, 1).reshape(b, u * h, lc, k)


def to_heads_chunked(x, axis: str, num_shards: int):
    """Same values as :func:`to_heads_flat` through the leading-axis exchange."""
    x = to_shard_major(x, axis, num_shards)                     # [U(seq), b, h, Lc, K]
    u, b, h, lc, k = x.shape
    return jnp.moveaxis(x, 0, 2).reshape(b, h, u * lc, k)


def from_heads_chunked(x, axis: str, num_shards: int):
    """Same values as :func:`from_heads_flat` through the leading-axis exchange."""
    b, h, l, k = x.shape
    x = jnp.moveaxis(x.reshape(b, h, num_shards, l // num_shards, k), 2, 0)
    return from_shard_major(x, axis)


__all__ = ["to_heads_flat", "from_heads_flat", "to_shard_major", "from_shard_major",
           "to_heads_chunked", "from_heads_chunked"]
