"""Encoder and decoder of the image VAE (diffusers' ``Encoder`` / ``Decoder`` of
``AutoencoderKL``), channels-last.

Encoder: ``conv_in`` → one :class:`~.blocks.DownEncoderBlock2D` per width (all but the last
halve the size) → mid block → GroupNorm → SiLU → ``conv_out`` to ``2 * latent_channels``
(posterior mean and log-variance). Decoder: ``conv_in`` → mid block → one
:class:`~.blocks.UpDecoderBlock2D` per width in reverse (``layers_per_block + 1`` residual
blocks each; all but the last double the size) → GroupNorm → SiLU → ``conv_out``.
"""

from __future__ import annotations

import jax
from flax import nnx

from ditax.models.vae.kl.blocks import (EPS, DownEncoderBlock2D, UNetMidBlock2D, UpDecoderBlock2D,
                                          run_stack)
from ditax.models.vae.kl.config import FluxVAEConfig
from ditax.models.vae.kl.layers import Conv2d, GroupNorm


class Encoder(nnx.Module):
    """Image ``[B, H, W, in_channels]`` → moments ``[B, H/s, W/s, 2 latent_channels]``."""

    def __init__(self, cfg: FluxVAEConfig, *, dtype, rngs, attention: str = "xla"):
        widths, g = cfg.block_out_channels, cfg.norm_num_groups
        self.conv_in = Conv2d(cfg.in_channels, widths[0], 3, dtype=dtype, rngs=rngs)
        self.down_blocks = nnx.List([
            DownEncoderBlock2D(widths[max(i - 1, 0)], w, cfg.layers_per_block, g,
                               i < len(widths) - 1, dtype=dtype, rngs=rngs)
            for i, w in enumerate(widths)])
        self.mid_block = UNetMidBlock2D(widths[-1], g, cfg.mid_block_add_attention, dtype=dtype,
                                        rngs=rngs, attention=attention)
        self.conv_norm_out = GroupNorm(g, widths[-1], EPS, dtype=dtype)
        self.conv_out = Conv2d(widths[-1], 2 * cfg.latent_channels, 3, dtype=dtype, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.mid_block(run_stack(self.down_blocks, self.conv_in(x)))
        return self.conv_out(jax.nn.silu(self.conv_norm_out(x)))


class Decoder(nnx.Module):
    """Latents ``[B, Y, X, latent_channels]`` → image ``[B, sY, sX, out_channels]`` (unclipped)."""

    def __init__(self, cfg: FluxVAEConfig, *, dtype, rngs, attention: str = "xla"):
        widths, g = cfg.block_out_channels[::-1], cfg.norm_num_groups
        self.conv_in = Conv2d(cfg.latent_channels, widths[0], 3, dtype=dtype, rngs=rngs)
        self.mid_block = UNetMidBlock2D(widths[0], g, cfg.mid_block_add_attention, dtype=dtype,
                                        rngs=rngs, attention=attention)
        self.up_blocks = nnx.List([
            UpDecoderBlock2D(widths[max(i - 1, 0)], w, cfg.layers_per_block + 1, g,
                             i < len(widths) - 1, dtype=dtype, rngs=rngs)
            for i, w in enumerate(widths)])
        self.conv_norm_out = GroupNorm(g, widths[-1], EPS, dtype=dtype)
        self.conv_out = Conv2d(widths[-1], cfg.out_channels, 3, dtype=dtype, rngs=rngs)

    def __call__(self, z: jax.Array) -> jax.Array:
        x = run_stack(self.up_blocks, self.mid_block(self.conv_in(z)))
        return self.conv_out(jax.nn.silu(self.conv_norm_out(x)))


__all__ = ["Decoder", "Encoder"]
