"""Tiled VAE decoding: overlapping spatial tiles blended linearly, as diffusers' ``tiled_decode``.

Large frames decode tile by tile so the activations of one tile, not of the whole frame, bound
the memory. Tiles are ``tile_min`` pixels (height, width) placed every ``tile_stride`` pixels;
each tile is cross-faded with the already-blended tile above and to its left over
``tile_min - tile_stride`` pixels, then cropped to the stride.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp


def check_tiles(tile_min: tuple[int, int], tile_stride: tuple[int, int], spatial: int) -> None:
    """Raise ``ValueError`` unless both are two positive multiples of ``spatial`` and the stride
    does not exceed the tile (which would leave gaps)."""
    for name, v in (("tile_sample_min", tile_min), ("tile_sample_stride", tile_stride)):
        if len(v) != 2 or any(int(t) <= 0 or int(t) % spatial for t in v):
            raise ValueError(f"WanVAE.decode: {name}={tuple(v)} must be two positive multiples of {spatial}.")
    if any(s > m for s, m in zip(tile_stride, tile_min)):
        raise ValueError(f"WanVAE.decode: tile_sample_stride={tuple(tile_stride)} must not exceed "
                         f"tile_sample_min={tuple(tile_min)} (tiles would leave gaps).")


def decode_tiled(decode: Callable[[jax.Array], jax.Array], x: jax.Array, tile_min: tuple[int, int],
                 tile_stride: tuple[int, int], spatial: int) -> jax.Array:
    """Tiled decode of channels-last latents ``[B, F, Y, X, z]`` → unclipped ``[B, F*, H, W, 3]``.

    ``decode`` maps a latent tile ``[B, F, y, x, z]`` to its frames ``[B, F*, y*s, x*s, 3]``
    (``s`` = ``spatial``, pixels per latent pixel); the mosaic is cropped to ``sY x sX``.
    """
    check_tiles(tile_min, tile_stride, spatial)
    (min_y, min_x), (st_y, st_x) = tile_min, tile_stride
    ly, lx = x.shape[2], x.shape[3]
    rows = []
    for i in range(0, ly, st_y // spatial):
        row = []
        for j in range(0, lx, st_x // spatial):
            tile = decode(x[:, :, i:i + min_y // spatial, j:j + min_x // spatial])
            if rows:
                tile = blend(rows[-1][len(row)], tile, min_y - st_y, axis=2)
            if row:
                tile = blend(row[-1], tile, min_x - st_x, axis=3)
            row.append(tile)
        rows.append(row)
    mosaic = jnp.concatenate(
        [jnp.concatenate([t[:, :, :st_y, :st_x] for t in row], axis=3) for row in rows], axis=2)
    return mosaic[:, :, :ly * spatial, :lx * spatial]


def blend(prev: jax.Array, tile: jax.Array, extent: int, axis: int) -> jax.Array:
    """Linear cross-fade of ``prev``'s last ``extent`` rows/cols into ``tile``'s first ones."""
    extent = min(prev.shape[axis], tile.shape[axis], extent)
    if extent <= 0:
        return tile
    w = (jnp.arange(extent, dtype=jnp.float32) / extent).astype(tile.dtype)
    w = w.reshape([-1 if a == axis else 1 for a in range(tile.ndim)])
    head = jax.lax.slice_in_dim(tile, 0, extent, axis=axis)
    tail = jax.lax.slice_in_dim(prev, prev.shape[axis] - extent, prev.shape[axis], axis=axis)
    mixed = tail * (1 - w) + head * w
    return jnp.concatenate([mixed, jax.lax.slice_in_dim(tile, extent, tile.shape[axis], axis=axis)], axis=axis)


__all__ = ["blend", "check_tiles", "decode_tiled"]
