"""Training-free block masks over the tiles of a :class:`~ditax.attention.sparse.tiles.
TileOrder`, as ``[tiles, tiles]`` bool tables (query tile x key tile: True = attend): what a
block-sparse kernel reads to skip whole blocks. ``element_mask`` expands one to the ``[L, L]``
token mask of a dense reference (tests, small sizes only).

- ``full``: every tile (dense attention);
- ``sliding_tile``: a query tile attends the key tiles within ``window = (wt, wh, ww)`` tiles of
  it along each axis (sliding-tile attention, STA: the window is in whole tiles, so each
  block is all kept or all skipped).
"""

from __future__ import annotations

import numpy as np

from dataclasses import dataclass

from ditax.attention.sparse.tiles import TileOrder

SPARSITIES = ("full", "sliding_tile")


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


def block_mask(order: TileOrder, sparsity: str = "full", window=(1, 1, 1)) -> np.ndarray:
    """The ``[tiles, tiles]`` table of ``sparsity`` (:data:`SPARSITIES`)."""
    n = int(np.prod(order.tiles))
    if sparsity == "full":
        return np.ones((n, n), bool)
    if sparsity == "sliding_tile":
        return sliding_tile_blocks(order, window)
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


def density(blocks: np.ndarray) -> float:
    """The fraction of blocks kept."""
    return float(blocks.mean())


def element_mask(order: TileOrder, blocks: np.ndarray) -> np.ndarray:
    """``[L, L]`` token mask (tile-major order) of the block table: a block's tokens all
    kept or all skipped, padding keys never attended."""
    t = order.tile_len
    dense = np.repeat(np.repeat(blocks, t, axis=0), t, axis=1)
    return dense & order.valid[None, :]


__all__ = ["BlockTable", "SPARSITIES", "block_mask", "density", "element_mask", "sliding_tile_blocks",
           "tile_coords"]
