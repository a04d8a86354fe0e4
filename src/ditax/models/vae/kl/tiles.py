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
from ditax.models.vae.kl.config import TILE_OVERLAP_FACTOR, FluxVAEConfig
from ditax.nn.tiling import stitch

Tile = Callable[[jax.Array], jax.Array]


def run_tiled(fn: Tile, x: jax.Array, tile_in: int, tile_out: int,
              overlap: float = TILE_OVERLAP_FACTOR) -> jax.Array:
    """``fn`` on square tiles of ``tile_in`` pixels of ``x`` ``[B, H, W, C]`` every
    ``int(tile_in (1 - overlap))`` pixels; its outputs (tiles of ``tile_out``) blended over
    ``int(tile_out overlap)`` and cropped to ``tile_out - int(tile_out overlap)``."""
    stride = int(tile_in * (1 - overlap))
    if stride < 1:
        raise ConfigError(f"FluxVAE tiling: a tile of {tile_in} pixels with overlap {overlap} "
                          f"moves by {stride}; raise sample_size in the VAE's config.json")
    extent = int(tile_out * overlap)
    keep = tile_out - extent
    return stitch(lambda i, j: fn(x[:, i:i + tile_in, j:j + tile_in]),
                  range(0, x.shape[1], stride), range(0, x.shape[2], stride),
                  (extent, extent), (keep, keep), axes=(1, 2))


def decode_tiled(decode: Tile, z: jax.Array, cfg: FluxVAEConfig) -> jax.Array:
    """Latents ``[B, Y, X, C]`` → image ``[B, H, W, 3]`` tile by tile (``decode`` maps one
    latent tile to its pixels)."""
    return run_tiled(decode, z, cfg.tile_latent_min_size, cfg.tile_sample_min_size)


def encode_tiled(encode: Tile, x: jax.Array, cfg: FluxVAEConfig) -> jax.Array:
    """Image ``[B, H, W, 3]`` → moments ``[B, Y, X, 2C]`` tile by tile (``encode`` maps one
    image tile to its moments)."""
    return run_tiled(encode, x, cfg.tile_sample_min_size, cfg.tile_latent_min_size)


__all__ = ["decode_tiled", "encode_tiled", "run_tiled"]
