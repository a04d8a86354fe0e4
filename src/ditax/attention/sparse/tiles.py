"""Tile-major token order: the video tokens of a ``(F, H, W)`` latent grid (frame-major, as the
transformers flatten them) regrouped so that each tile of ``(t, h, w)`` tokens is one
contiguous run of ``t * h * w`` tokens (one kernel block), tiles in frame-major order.

A grid that is no multiple of the tile is padded up (``padded_grid``); the padding positions
are marked invalid (``valid``) so a kernel masks them as keys and drops them as queries.
:meth:`TileOrder.to_tiles` and :meth:`TileOrder.from_tiles` are exact inverses on the valid
tokens (a gather each way; no arithmetic touches the values).

:func:`least_padding_tile` picks a tile for a grid (``attention.tile=auto``): the kernel-aligned
tile (a multiple of 128 tokens, at most 1024) that pads the grid least. Wan 2.1's 480p x 81
grid ``21 x 30 x 52`` (32,760 tokens) is 43,008 in ``4 x 8 x 8`` tiles (+31%) and 34,944 in
``3 x 32 x 4`` ones (+6.7%); at 720p (``21 x 45 x 80``) 92,160 (+22%) against 80,640 in
``3 x 16 x 8`` (+6.7%).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ditax.intmath import ceil_div


@dataclass(frozen=True)
class TileOrder:
    """The tile-major order of a ``grid = (F, H, W)`` token grid in ``tile = (t, h, w)`` tiles.

    ``frames``: at least this many tile-frames (0: as many as the grid needs); the extra ones,
    appended after the last, are whole padding tiles (so that the tile count divides a
    sequence-parallel mesh's context shards, :func:`~ditax.attention.sparse.layout.
    sparse_layout`)."""

    grid: tuple[int, int, int]
    tile: tuple[int, int, int]
    frames: int = 0

    def __post_init__(self):
        for name, v in (("grid", self.grid), ("tile", self.tile)):
            if len(v) != 3 or any(not isinstance(n, (int, np.integer)) or n < 1 for n in v):
                raise ValueError(f"{name}={v!r} must be three positive ints (frames, height, "
                                 f"width), e.g. grid=(21, 30, 52) tile=(4, 8, 8)")

    @property
    def tiles(self) -> tuple[int, int, int]:
        """Tiles along each axis (the padded grid over the tile)."""
        nt, nh, nw = (ceil_div(g, t) for g, t in zip(self.grid, self.tile))
        return max(nt, self.frames), nh, nw

    @property
    def padded_grid(self) -> tuple[int, int, int]:
        return tuple(n * t for n, t in zip(self.tiles, self.tile))

    @property
    def tile_len(self) -> int:
        return int(np.prod(self.tile))

    @property
    def length(self) -> int:
        """Tokens in the tile-major order (padding included): :func:`padded_length`, and the
        extra tile-frames'."""
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


#: ``attention.tile``'s default (256 tokens: the tile of STA and VSA's papers)
DEFAULT = (4, 8, 8)
#: tile sizes :func:`least_padding_tile` considers: multiples of ``UNIT`` tokens (a kernel
#: block: 128 lanes) up to ``MOST``; ties go to a size in ``SANE`` (tokens), then to the most
#: cube-like shape
UNIT, MOST, SANE = 128, 1024, (256, 512)


def padded_length(grid, tile) -> int:
    """Tokens of ``grid`` laid out in ``tile`` tiles (padding included)."""
    return int(np.prod([ceil_div(g, t) * t for g, t in zip(grid, tile)]))


def least_padding_tile(grid, unit: int = UNIT, most: int = MOST) -> tuple[int, int, int]:
    """The tile ``(t, h, w)`` of ``unit·k <= most`` tokens that pads ``grid = (F, Y, X)``
    least (:func:`padded_length`); among equals, one of :data:`SANE` size (a kernel block
    neither tiny nor past the VMEM that a VSA step holds), then the most cube-like (the
    smallest ratio of its longest to its shortest side, over the axes the grid spans: a
    single-frame grid's tile has ``t = 1`` and is judged on ``h, w``), then the larger ``h``.
    ``attention.tile=auto`` (:func:`ditax.attention.sparse.layout.sparse_layout`)."""
    grid = tuple(int(n) for n in grid)
    if len(grid) != 3 or min(grid) < 1:
        raise ValueError(f"grid={grid!r} must be three positive ints (frames, height, width)")
    # a side past twice the grid's only pads more; a grid too small for any such tile takes
    # sides up to ``most`` (one tile, mostly padding: such a grid is better run dense)
    best = _search(grid, unit, most, [min(2 * g, most) for g in grid]) or _search(
        grid, unit, most, [most] * 3)
    if best is None:
        raise ValueError(f"no tile of a multiple of {unit} tokens up to {most} exists")
    return best


def _search(grid, unit: int, most: int, caps) -> tuple[int, int, int] | None:
    best, best_key = None, None
    for t in range(1, caps[0] + 1):
        for h in range(1, min(caps[1], most // t) + 1):
            for w in range(1, min(caps[2], most // (t * h)) + 1):
                n = t * h * w
                if n % unit:
                    continue
                spans = [s for s, g in zip((t, h, w), grid) if g > 1] or [1]
                key = (padded_length(grid, (t, h, w)), not SANE[0] <= n <= SANE[1],
                       max(spans) / min(spans), -h)
                if best_key is None or key < best_key:
                    best, best_key = (t, h, w), key
    return best


def padding_note(grid, tile) -> str:
    """One line: the padded length of ``grid`` in ``tile`` tiles and its excess, e.g. ``21x30x52
    in 3x32x4 tiles (384 tokens): 34,944 tokens for 32,760 (+6.7%)``."""
    n, L = padded_length(grid, tile), int(np.prod(grid))
    return (f"{'x'.join(map(str, grid))} in {'x'.join(map(str, tile))} tiles "
            f"({int(np.prod(tile))} tokens): {n:,} tokens for {L:,} (+{100 * (n / L - 1):.1f}%)")


__all__ = ["DEFAULT", "MOST", "SANE", "TileOrder", "UNIT", "least_padding_tile", "padded_length",
           "padding_note"]
