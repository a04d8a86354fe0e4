"""Rotary position embedding: axial angle tables (any number of axes) and the rotation."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np


def axial_rope_angles(dims, grid, theta: float = 10000.0) -> np.ndarray:
    """Rotation angles ``[L, sum(dims)/2]`` (float64, host) for a token grid.

    ``dims[a]`` head-dim entries rotate with the position along axis ``a`` of ``grid``
    (e.g. ``(F', Y', X')``); tokens are ordered row-major over the grid. Pair ``i`` of axis
    ``a``'s block rotates by ``pos * theta**(-2i/dims[a])``.
    """
    grid = tuple(int(g) for g in grid)
    parts = []
    for a, (d, n) in enumerate(zip(dims, grid)):
        inv = 1.0 / (theta ** (np.arange(0, d, 2, dtype=np.float64)[: d // 2] / d))
        ang = np.arange(n, dtype=np.float64)[:, None] * inv[None, :]
        shape = [1] * len(grid)
        shape[a] = n
        parts.append(np.broadcast_to(ang.reshape(*shape, -1), grid + (d // 2,)))
    return np.concatenate(parts, axis=-1).reshape(int(np.prod(grid)), sum(dims) // 2)


def apply_rope(x, cos, sin, *, head_major: bool = False):
    """Rotate the interleaved pairs ``(x[2i], x[2i+1])`` of ``x [B, L, N, K]`` (or, with
    ``head_major``, ``[B, N, L, K]``).

    ``cos`` / ``sin``: ``[L, K]`` float32, each pair's value repeated on both of its channels
    (diffusers' ``repeat_interleave(2)`` tables, :func:`pair_tables`). As the reference:
    ``out[2i] = x[2i]·cos − x[2i+1]·sin``, ``out[2i+1] = x[2i+1]·cos + x[2i]·sin`` in float32,
    rounded once to ``x.dtype``.

    Each channel's signed partner (``−x[2i+1]`` for ``2i``, ``x[2i]`` for ``2i+1``) is
    ``x @ P`` with a constant signed permutation ``P [K, K]``: every output is one input
    times ±1, exact in the float32 accumulator (bf16 at the default precision, other dtypes
    pinned to "highest"). The rotation is then the epilogue of that product — on TPU one
    fusion that reads ``x`` in its own layout and writes the result, where splitting K into
    ``(K/2, 2)`` (a size-2 minor axis) made XLA relayout float32 copies of q and k and
    stack the pairs back (4 copies per layer at Wan 14B 720p). The extra MXU work is
    ``2·K`` FLOPs per element of q and k (~0.1% of a Wan 14B 720p layer).
    """
    k = x.shape[-1]
    if k % 2 or cos.shape[-1] != k or sin.shape[-1] != k:
        raise ValueError(f"apply_rope: x{tuple(x.shape)} needs an even head dim and cos/sin "
                         f"tables [L, {k}]; got cos{tuple(cos.shape)} sin{tuple(sin.shape)}")
    exact = (jax.lax.Precision.DEFAULT if jnp.dtype(x.dtype) == jnp.bfloat16
             else jax.lax.Precision.HIGHEST)
    partner = jnp.einsum("blnk,kj->blnj", x, jnp.asarray(_partner_matrix(k), x.dtype),
                         precision=exact, preferred_element_type=jnp.float32)
    c = cos[None, None] if head_major else cos[None, :, None, :]
    s = sin[None, None] if head_major else sin[None, :, None, :]
    return (x.astype(jnp.float32) * c + partner * s).astype(x.dtype)


@functools.lru_cache(maxsize=16)
def _partner_matrix(k: int) -> np.ndarray:
    """``P [K, K]`` with ``(x @ P)[2i] = −x[2i+1]`` and ``(x @ P)[2i+1] = x[2i]``."""
    p = np.zeros((k, k), np.float32)
    p[np.arange(1, k, 2), np.arange(0, k, 2)] = -1.0
    p[np.arange(0, k, 2), np.arange(1, k, 2)] = 1.0
    return p


def pair_tables(angles) -> tuple[np.ndarray, np.ndarray]:
    """``(cos, sin)`` ``[L, 2P]`` float32 (host) of angles ``[L, P]``, each pair's value on both
    of its channels — the tables :func:`apply_rope` takes."""
    a = np.repeat(np.asarray(angles, np.float64), 2, axis=-1)
    return np.cos(a).astype(np.float32), np.sin(a).astype(np.float32)
