"""Rotary position embedding: axial angle tables (any number of axes) and the rotation."""

from __future__ import annotations

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


def apply_rope(x, cos, sin):
    """Rotate interleaved pairs of ``x [B, L, N, K]`` by angles ``cos/sin [L, K/2]`` (float32)."""
    xf = x.astype(jnp.float32).reshape(*x.shape[:-1], x.shape[-1] // 2, 2)
    x1, x2 = xf[..., 0], xf[..., 1]
    c = cos[None, :, None, :]
    s = sin[None, :, None, :]
    out = jnp.stack([x1 * c - x2 * s, x1 * s + x2 * c], axis=-1)
    return out.reshape(x.shape).astype(x.dtype)
