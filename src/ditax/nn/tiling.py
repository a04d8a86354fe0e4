"""Overlapping tiles blended into one array: the stitching of diffusers' tiled VAE decodes.

A large image (or video frame) is processed tile by tile so that one tile's activations, not the
whole image's, bound the memory. Each output tile is cross-faded linearly with the (already
blended) tile above it and then with the one to its left, over a fixed number of rows /
columns, and cropped; the crops are concatenated. The VAEs differ only in where the tiles start,
how far they overlap and how much of each is kept, so those are arguments here
(``models/vae/wan/tiling.py``, ``models/vae/kl/model.py``).
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp


def blend(prev: jax.Array, tile: jax.Array, extent: int, axis: int) -> jax.Array:
    """Cross-fade ``prev``'s last ``extent`` rows / columns (along ``axis``) into ``tile``'s first
    ones: position ``k`` of the overlap is ``prev * (1 - k/extent) + tile * k/extent``; the
    overlap is clipped to both tiles' sizes, as diffusers' ``blend_v`` / ``blend_h``."""
    extent = min(prev.shape[axis], tile.shape[axis], extent)
    if extent <= 0:
        return tile
    w = (jnp.arange(extent, dtype=jnp.float32) / extent).astype(tile.dtype)
    w = w.reshape([-1 if a == axis else 1 for a in range(tile.ndim)])
    head = jax.lax.slice_in_dim(tile, 0, extent, axis=axis)
    tail = jax.lax.slice_in_dim(prev, prev.shape[axis] - extent, prev.shape[axis], axis=axis)
    mixed = tail * (1 - w) + head * w
    return jnp.concatenate([mixed, jax.lax.slice_in_dim(tile, extent, tile.shape[axis], axis=axis)],
                           axis=axis)


def _crop(t: jax.Array, keep: tuple[int, int], axes: tuple[int, int]) -> jax.Array:
    for n, a in zip(keep, axes):
        t = jax.lax.slice_in_dim(t, 0, min(n, t.shape[a]), axis=a)
    return t


def stitch(tile_at: Callable[[int, int], jax.Array], starts_y: Sequence[int],
           starts_x: Sequence[int], extent: tuple[int, int], keep: tuple[int, int],
           axes: tuple[int, int]) -> jax.Array:
    """The blended mosaic of the tiles ``tile_at(y, x)`` for every ``y`` in ``starts_y`` and ``x``
    in ``starts_x`` (row-major; each computed once, by the caller's own program).

    Each tile is blended with the blended tile above over ``extent[0]`` along ``axes[0]``, then
    with the blended tile to its left over ``extent[1]`` along ``axes[1]`` (:func:`blend`), and
    cropped to its first ``keep`` rows / columns; no final crop (a caller that wants the
    mosaic at an exact size crops it). The blending is one compiled program per grid of tile
    shapes (not one small program per slice and product); it holds the tiles and the output.
    """
    grid = [[tile_at(y, x) for x in starts_x] for y in starts_y]
    return _mosaic(grid, tuple(extent), tuple(keep), tuple(axes))


@functools.partial(jax.jit, static_argnames=("extent", "keep", "axes"))
def _mosaic(grid, extent, keep, axes):
    ay, ax = axes
    above: list[jax.Array] = []
    rows = []
    for tiles in grid:
        row: list[jax.Array] = []
        for c, tile in enumerate(tiles):
            if above:
                tile = blend(above[c], tile, extent[0], ay)
            if row:
                tile = blend(row[-1], tile, extent[1], ax)
            row.append(tile)
        rows.append(jnp.concatenate([_crop(t, keep, axes) for t in row], axis=ax))
        above = row
    return jnp.concatenate(rows, axis=ay)


__all__ = ["blend", "stitch"]
