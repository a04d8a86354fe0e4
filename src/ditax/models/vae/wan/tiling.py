"""Tiled VAE decoding: overlapping spatial tiles blended linearly, as diffusers' ``tiled_decode``.

Large frames decode tile by tile so the activations of one tile, not of the whole frame, bound
the memory. Tiles are ``tile_min`` pixels (height, width) placed every ``tile_stride`` pixels;
each tile is cross-faded with the already-blended tile above and to its left over
``tile_min - tile_stride`` pixels, then cropped to the stride (:func:`ditax.nn.tiling.stitch`).
"""

from __future__ import annotations

from typing import Callable

import jax

from ditax.nn.tiling import stitch


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
    ty, tx = min_y // spatial, min_x // spatial
    mosaic = stitch(lambda i, j: decode(x[:, :, i:i + ty, j:j + tx]),
                    range(0, ly, st_y // spatial), range(0, lx, st_x // spatial),
                    (min_y - st_y, min_x - st_x), (st_y, st_x), axes=(2, 3))
    return mosaic[:, :, :ly * spatial, :lx * spatial]


__all__ = ["check_tiles", "decode_tiled"]
