"""Training-free block masks over the tiles of a :class:`~ditax.attention.sparse.tiles.
TileOrder`, as ``[tiles, tiles]`` bool tables (query tile x key tile: True = attend): what a
block-sparse kernel reads to skip whole blocks. ``element_mask`` expands one to the ``[L, L]``
token mask of a dense reference (tests, small sizes only).

- ``full``: every tile (dense attention);
- ``sliding_tile``: a query tile attends the key tiles within ``window = (wt, wh, ww)`` tiles of
  it along each axis (sliding-tile attention, STA: the window is in whole tiles, so each
  block is all kept or all skipped);
- ``radial``: radial attention (Li et al. 2025, "Radial Attention: O(n log n) sparse attention
  with energy decay for long video generation"): the attention a key tile gets decays with its
  temporal distance from the query tile, so the spatial window shrinks by half each time the
  distance in tile-frames doubles (:func:`radial_blocks`); the first tile-frame is a sink every
  query attends whole. Kept blocks grow as ``n log n`` in the tokens ``n``.
"""

from __future__ import annotations

import numpy as np

from dataclasses import dataclass

from ditax.attention.sparse.tiles import TileOrder

SPARSITIES = ("full", "sliding_tile", "radial")


def tile_coords(order: TileOrder) -> np.ndarray:
    """``[tiles, 3]``: each tile's (frame, row, column) index, in tile-major order."""
    nt, nh, nw = order.tiles
    return np.stack(np.meshgrid(np.arange(nt), np.arange(nh), np.arange(nw), indexing="ij"),
                    -1).reshape(-1, 3)


def sliding_tile_blocks(order: TileOrder, window: tuple[int, int, int]) -> np.ndarray:
    """The sliding-tile block table: query tile ``i`` attends key tile ``j`` iff they are at
    most ``window`` tiles apart along every axis."""
    w = np.asarray(window)
    if w.shape != (3,) or (w < 0).any():
        raise ValueError(f"window={window!r} must be three ints >= 0 (tiles along frames, "
                         f"rows, columns), e.g. (1, 1, 1)")
    c = tile_coords(order)
    return (np.abs(c[:, None, :] - c[None, :, :]) <= w).all(-1)


def radial_blocks(order: TileOrder, decay: float = 1.0) -> np.ndarray:
    """The radial block table, the paper's rule on tiles. With ``d`` the distance of the query
    and key tile-frames, ``r = floor(log2(max(d, 1)))`` its band and ``S`` the tiles of one
    tile-frame (numbered row-major: ``s``), query tile ``i`` attends key tile ``j`` iff

    - ``j`` is in the first tile-frame (the attention sink), or
    - ``r == 0`` (the same or the next tile-frame: dense), or
    - ``|s_i - s_j| + 1 <= max(w_r, 1)`` with ``w_r = decay * S / 2**r`` (the spatial window
      halves as the distance doubles) and, once ``w_r < 1`` (the window is one tile), ``d`` a
      multiple of ``ceil(1 / w_r)`` (farther tile-frames are visited every so many frames).

    ``decay > 0`` scales the windows of the bands past the dense one (the paper's decay factor;
    smaller is sparser)."""
    if not (isinstance(decay, (int, float)) and np.isfinite(decay) and decay > 0):
        raise ValueError(f"decay={decay!r} must be a finite number > 0 (the radial windows' "
                         f"scale), e.g. 1.0")
    c = tile_coords(order)
    nw = order.tiles[2]
    S = order.tiles[1] * nw
    s = c[:, 1] * nw + c[:, 2]
    d = np.abs(c[:, None, 0] - c[None, :, 0])
    r = np.floor(np.log2(np.maximum(d, 1))).astype(np.int64)      # band: 0 for d <= 1
    w = decay * S / 2.0 ** r
    spatial = np.abs(s[:, None] - s[None, :]) + 1 <= np.maximum(w, 1)
    stride = np.where(w < 1, np.ceil(1 / w), 1).astype(np.int64)
    return (c[None, :, 0] == 0) | (r == 0) | (spatial & (d % stride == 0))


def block_mask(order: TileOrder, sparsity: str = "full", window=(1, 1, 1),
               decay: float = 1.0) -> np.ndarray:
    """The ``[tiles, tiles]`` table of ``sparsity`` (:data:`SPARSITIES`): ``window`` (half
    spans in tiles) is ``sliding_tile``'s, ``decay`` ``radial``'s."""
    n = int(np.prod(order.tiles))
    if sparsity == "full":
        return np.ones((n, n), bool)
    if sparsity == "sliding_tile":
        return sliding_tile_blocks(order, window)
    if sparsity == "radial":
        return radial_blocks(order, decay)
    raise ValueError(f"sparsity={sparsity!r} is not one of {', '.join(SPARSITIES)}")


@dataclass(frozen=True)
class BlockTable:
    """A ``[tiles, tiles]`` block table in a hashable form for a kernel (its block-level
    mask is built once per table and length): ``tile_len`` tokens a tile, ``tiles`` per
    side, ``bits`` the table's bytes (row-major)."""

    tile_len: int
    tiles: int
    bits: bytes

    @classmethod
    def of(cls, order: TileOrder, blocks: np.ndarray) -> "BlockTable":
        blocks = np.asarray(blocks, bool)
        n = int(np.prod(order.tiles))
        if blocks.shape != (n, n):
            raise ValueError(f"a block table of {order.tiles} tiles is [{n}, {n}], not "
                             f"{list(blocks.shape)}")
        return cls(order.tile_len, n, np.packbits(blocks).tobytes())

    @property
    def table(self) -> np.ndarray:
        bits = np.unpackbits(np.frombuffer(self.bits, np.uint8))[: self.tiles * self.tiles]
        return bits.reshape(self.tiles, self.tiles).astype(bool)

    def tokens(self, rows: slice, cols: slice) -> np.ndarray:
        """The token mask of query ids ``rows`` x key ids ``cols`` (ids past the table, a
        kernel's padding, are not attended)."""
        t, n = self.tile_len, self.tiles
        qi, ki = np.arange(rows.start, rows.stop) // t, np.arange(cols.start, cols.stop) // t
        out = self.table[np.minimum(qi, n - 1)][:, np.minimum(ki, n - 1)]
        return out & (qi < n)[:, None] & (ki < n)[None, :]


def without_empty_tiles(order: TileOrder, blocks: np.ndarray) -> np.ndarray:
    """``blocks`` with each tile that holds no real token (a whole padding tile,
    :attr:`TileOrder.frames`) attending only itself and attended by no other: one block of
    work each, whatever the rule would give it (its keys are masked and its queries dropped
    anyway; keeping its own block leaves no query row without a block)."""
    empty = ~order.valid.reshape(-1, order.tile_len).any(1)
    if not empty.any():
        return blocks
    out = blocks & ~empty[:, None] & ~empty[None, :]
    out[empty, empty] = True
    return out


def density(blocks: np.ndarray) -> float:
    """The fraction of blocks kept."""
    return float(blocks.mean())


def element_mask(order: TileOrder, blocks: np.ndarray) -> np.ndarray:
    """``[L, L]`` token mask (tile-major order) of the block table: a block's tokens all
    kept or all skipped, padding keys never attended."""
    t = order.tile_len
    dense = np.repeat(np.repeat(blocks, t, axis=0), t, axis=1)
    return dense & order.valid[None, :]


__all__ = ["BlockTable", "SPARSITIES", "block_mask", "density", "element_mask", "radial_blocks",
           "sliding_tile_blocks", "tile_coords", "without_empty_tiles"]
