"""Encoder and decoder of LTX-2's video VAE (diffusers ``LTX2VideoEncoder3d`` /
``LTX2VideoDecoder3d``), channels-last, each a function of the whole clip (no streaming: the
decoder is not causal in time, so each frame depends on later ones; long or large clips are cut
into overlapping tiles instead, :mod:`.tiling`).

Encoder: ``p x p`` pixel patches as channels → ``conv_in`` (to ``latent_channels``) → levels
(resnets, downsampler) → mid block → RMS norm → SiLU → ``conv_out`` to ``latent_channels + 1``:
the means and one shared log-variance channel. Decoder: ``conv_in`` → mid block → levels
(upsampler, resnets) → RMS norm → (timestep shift / scale) → SiLU → ``conv_out`` → patches back
to pixels.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.models.vae.ltx2.blocks import (DownBlock, MidBlock, TimeEmbedder, UpBlock, modulate,
                                          shift_scale_table)
from ditax.models.vae.ltx2.config import LTX2VideoVAEConfig
from ditax.models.vae.ltx2.layers import CausalConv3d, rms_norm
from ditax.models.vae.ltx2.shuffle import patchify, unpatchify


class Encoder(nnx.Module):
    """Video ``[B, F, H, W, in_channels]`` → ``[B, F', Y, X, latent_channels + 1]`` (means, then
    the log-variance channel; before diffusers' repetition of it, see
    :func:`~ditax.models.vae.ltx2.model.split_moments`)."""

    def __init__(self, cfg: LTX2VideoVAEConfig, *, dtype, rngs):
        self.patch_size = cfg.patch_size
        self.causal = cfg.encoder_causal
        mode = cfg.encoder_spatial_padding_mode
        levels = cfg.encoder_levels()
        self.conv_in = CausalConv3d(cfg.in_channels * cfg.patch_size ** 2, cfg.latent_channels,
                                    padding_mode=mode, dtype=dtype, rngs=rngs)
        self.down_blocks = nnx.List([
            DownBlock(lv.cin, lv.cout, lv.layers, lv.down, eps=cfg.resnet_norm_eps,
                      padding_mode=mode, dtype=dtype, rngs=rngs) for lv in levels])
        width = levels[-1].cout if levels else cfg.latent_channels
        self.mid_block = MidBlock(width, cfg.layers_per_block[-1], eps=cfg.resnet_norm_eps,
                                  padding_mode=mode, timestep=False, dtype=dtype, rngs=rngs)
        self.conv_out = CausalConv3d(width, cfg.latent_channels + 1, padding_mode=mode,
                                     dtype=dtype, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.conv_in(patchify(x, self.patch_size), self.causal)
        for block in self.down_blocks:
            x = block(x, self.causal)
        x = self.mid_block(x, None, self.causal)
        return self.conv_out(jax.nn.silu(rms_norm(x)), self.causal)


class Decoder(nnx.Module):
    """Latents ``[B, F', Y, X, latent_channels]`` (and, when conditioned, the timestep ``[B]``)
    → unclipped video ``[B, 1 + tf (F' - 1), sY, sX, out_channels]``."""

    def __init__(self, cfg: LTX2VideoVAEConfig, *, dtype, rngs):
        self.patch_size = cfg.patch_size
        self.causal = cfg.decoder_causal
        mode, cond = cfg.decoder_spatial_padding_mode, cfg.timestep_conditioning
        levels = cfg.decoder_levels()
        width = cfg.decoder_block_out_channels[-1]
        kw = dict(eps=cfg.resnet_norm_eps, padding_mode=mode, timestep=cond, dtype=dtype,
                  rngs=rngs)
        self.conv_in = CausalConv3d(cfg.latent_channels, width, padding_mode=mode, dtype=dtype,
                                    rngs=rngs)
        self.mid_block = MidBlock(width, cfg.decoder_layers_per_block[-1], **kw)
        self.up_blocks = nnx.List([UpBlock(lv, **kw) for lv in levels])
        out = levels[-1].cout if levels else width
        self.conv_out = CausalConv3d(out, cfg.out_channels * cfg.patch_size ** 2,
                                     padding_mode=mode, dtype=dtype, rngs=rngs)
        self.timestep_scale_multiplier = (nnx.Param(jnp.asarray(1000.0, jnp.float32))
                                          if cond else None)
        self.time_embedder = TimeEmbedder(2 * out, dtype=dtype, rngs=rngs) if cond else None
        self.scale_shift_table = shift_scale_table(2, out, dtype, rngs) if cond else None

    def __call__(self, z: jax.Array, timestep: jax.Array | None) -> jax.Array:
        x = self.conv_in(z, self.causal)
        t = None
        if self.timestep_scale_multiplier is not None:
            t = timestep * self.timestep_scale_multiplier[...]
        x = self.mid_block(x, t, self.causal)
        for block in self.up_blocks:
            x = block(x, t, self.causal)
        x = rms_norm(x)
        if self.time_embedder is not None:
            e = self.time_embedder(t, x.dtype)
            mod = e.reshape(e.shape[0], 2, -1) + self.scale_shift_table[...][None]
            x = modulate(x, mod[:, 0].astype(x.dtype), mod[:, 1].astype(x.dtype))
        x = self.conv_out(jax.nn.silu(x), self.causal)
        return unpatchify(x, self.patch_size)


__all__ = ["Decoder", "Encoder"]
