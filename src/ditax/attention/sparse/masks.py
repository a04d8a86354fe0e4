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
    raise ValueError(f"attention.sparsity={sparsity!r} is not one of {', '.join(SPARSITIES)}")


def density(blocks: np.ndarray) -> float:
    """The fraction of blocks kept."""
    return float(blocks.mean())


def element_mask(order: TileOrder, blocks: np.ndarray) -> np.ndarray:
    """``[L, L]`` token mask (tile-major order) of the block table: a block's tokens all
    kept or all skipped, padding keys never attended."""
    t = order.tile_len
    dense = np.repeat(np.repeat(blocks, t, axis=0), t, axis=1)
    return dense & order.valid[None, :]


__all__ = ["SPARSITIES", "block_mask", "density", "element_mask", "sliding_tile_blocks",
           "tile_coords"]
