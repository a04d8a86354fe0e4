"""Tile-major token order: the video tokens of a ``(F, H, W)`` latent grid (frame-major, as the
transformers flatten them) regrouped so that each tile of ``(t, h, w)`` tokens is one
contiguous run of ``t * h * w`` tokens (one kernel block), tiles in frame-major order.

A grid that is no multiple of the tile is padded up (``padded_grid``); the padding positions
are marked invalid (``valid``) so a kernel masks them as keys and drops them as queries.
:meth:`TileOrder.to_tiles` and :meth:`TileOrder.from_tiles` are exact inverses on the valid
tokens (a gather each way; no arithmetic touches the values).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ditax.intmath import ceil_div


@dataclass(frozen=True)
class TileOrder:
    """The tile-major order of a ``grid = (F, H, W)`` token grid in ``tile = (t, h, w)`` tiles."""

    grid: tuple[int, int, int]
    tile: tuple[int, int, int]

    def __post_init__(self):
        for name, v in (("grid", self.grid), ("tile", self.tile)):
            if len(v) != 3 or any(not isinstance(n, (int, np.integer)) or n < 1 for n in v):
                raise ValueError(f"{name}={v!r} must be three positive ints (frames, height, "
                                 f"width), e.g. grid=(21, 30, 52) tile=(4, 8, 8)")

    @property
    def tiles(self) -> tuple[int, int, int]:
        """Tiles along each axis (the padded grid over the tile)."""
        return tuple(ceil_div(g, t) for g, t in zip(self.grid, self.tile))

    @property
    def padded_grid(self) -> tuple[int, int, int]:
        return tuple(n * t for n, t in zip(self.tiles, self.tile))

    @property
    def tile_len(self) -> int:
        return int(np.prod(self.tile))

    @property
    def length(self) -> int:
        """Tokens in the tile-major order (padding included)."""
        return int(np.prod(self.padded_grid))

    @cached_property
    def source(self) -> np.ndarray:
        """``[length]``: position ``i`` of the tile-major order holds token ``source[i]`` of the
        frame-major order (``-1``: padding)."""
        (nt, nh, nw), (t, h, w) = self.tiles, self.tile
        f, y, x = np.meshgrid(np.arange(nt * t), np.arange(nh * h), np.arange(nw * w),
                              indexing="ij")
        # padded grid [nt, t, nh, h, nw, w] -> tiles first [nt, nh, nw, t, h, w]
        def tiled(a):
            return a.reshape(nt, t, nh, h, nw, w).transpose(0, 2, 4, 1, 3, 5).reshape(-1)
        f, y, x = tiled(f), tiled(y), tiled(x)
        F, H, W = self.grid
        inside = (f < F) & (y < H) & (x < W)
        return np.where(inside, (f * H + y) * W + x, -1).astype(np.int64)

    @property
    def valid(self) -> np.ndarray:
        """``[length]`` bool: a real token (not padding)."""
        return self.source >= 0

    @cached_property
    def target(self) -> np.ndarray:
        """``[F * H * W]``: where each frame-major token sits in the tile-major order."""
        out = np.empty(int(np.prod(self.grid)), np.int64)
        keep = self.valid
        out[self.source[keep]] = np.nonzero(keep)[0]
        return out

    def to_tiles(self, x, axis: int = 1):
        """``x`` with its frame-major token axis ``axis`` (length ``F * H * W``) in tile-major
        order (length :attr:`length`, zeros at the padding)."""
        import jax.numpy as jnp

        idx = jnp.asarray(np.maximum(self.source, 0))
        out = jnp.take(x, idx, axis=axis)
        shape = [1] * out.ndim
        shape[axis] = self.length
        return jnp.where(jnp.asarray(self.valid).reshape(shape), out, jnp.zeros((), x.dtype))

    def from_tiles(self, y, axis: int = 1):
        """The inverse of :meth:`to_tiles`: the frame-major tokens back (padding dropped)."""
        import jax.numpy as jnp

        return jnp.take(y, jnp.asarray(self.target), axis=axis)


__all__ = ["TileOrder"]
