"""Tiled encode / decode of the image VAE with diffusers' ``AutoencoderKL`` tile arithmetic.

From the config (``sample_size`` = the tile side in pixels ``T``, ``tile_latent_min_size`` =
``t = int(T / s)`` latent pixels) and the overlap factor ``f`` (0.25):

- decode: latent tiles of ``t`` every ``int(t (1 - f))`` latent pixels; each decoded tile is
  blended with its (blended) neighbours above and to the left over ``int(T f)`` pixels and
  cropped to ``T - int(T f)``;
- encode: image tiles of ``T`` every ``int(T (1 - f))`` pixels; the moments (mean and
  log-variance, before the clamp) blend over ``int(t f)`` latent pixels and are cropped to
  ``t - int(t f)``.

No final crop, as diffusers (with FLUX.1's sizes the crops add up to the full image). The
blending is :func:`ditax.nn.tiling.stitch`; each tile is one call of a compiled program, so
only one tile's activations are alive at a time.
"""

from __future__ import annotations

from typing import Callable

import jax

from ditax.errors import ConfigError
from ditax.models.flux.vae.config import TILE_OVERLAP_FACTOR, FluxVAEConfig
from ditax.nn.tiling import stitch

Tile = Callable[[jax.Array], jax.Array]


def _stride(tile: int, overlap: float, what: str) -> int:
    stride = int(tile * (1 - overlap))
    if stride < 1:
        raise ConfigError(f"FluxVAE tiling: a tile of {tile} {what} with overlap {overlap} "
                          f"moves by {stride}; raise sample_size in the VAE's config.json")
    return stride


def decode_tiled(decode: Tile, z: jax.Array, cfg: FluxVAEConfig,
                 overlap: float = TILE_OVERLAP_FACTOR) -> jax.Array:
    """Latents ``[B, Y, X, C]`` → image ``[B, H, W, 3]`` tile by tile (``decode`` maps one
    latent tile to its pixels)."""
    t, big = cfg.tile_latent_min_size, cfg.tile_sample_min_size
    stride = _stride(t, overlap, "latent pixels")
    extent = int(big * overlap)
    keep = big - extent
    return stitch(lambda i, j: decode(z[:, i:i + t, j:j + t]),
                  range(0, z.shape[1], stride), range(0, z.shape[2], stride),
                  (extent, extent), (keep, keep), axes=(1, 2))


def encode_tiled(encode: Tile, x: jax.Array, cfg: FluxVAEConfig,
                 overlap: float = TILE_OVERLAP_FACTOR) -> jax.Array:
    """Image ``[B, H, W, 3]`` → moments ``[B, Y, X, 2C]`` tile by tile (``encode`` maps one
    image tile to its moments)."""
    big, t = cfg.tile_sample_min_size, cfg.tile_latent_min_size
    stride = _stride(big, overlap, "pixels")
    extent = int(t * overlap)
    keep = t - extent
    return stitch(lambda i, j: encode(x[:, i:i + big, j:j + big]),
                  range(0, x.shape[1], stride), range(0, x.shape[2], stride),
                  (extent, extent), (keep, keep), axes=(1, 2))


__all__ = ["decode_tiled", "encode_tiled"]
