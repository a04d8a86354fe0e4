"""Encoder and decoder stacks of the Wan VAE (diffusers ``WanEncoder3d`` / ``WanDecoder3d``).

Widths follow ``base_dim * dim_mult``; each level but the last halves the resolution (encoder)
or doubles it (decoder), in time too where ``temperal_downsample`` says so. Both run on one
chunk of frames with the feature cache of the previous chunk (see :mod:`.chunks`). The Wan 2.1
levels are flat lists of blocks; the Wan 2.2 (``is_residual``) levels are the blocks of
:mod:`.residual`. Channels here are the coder's (patch channels for a patchified VAE).
"""

from __future__ import annotations

import jax
from flax import nnx

from ditax.models.vae.wan import residual
from ditax.models.vae.wan.blocks import MidBlock, Resample, ResidualBlock, UpBlock
from ditax.models.vae.wan.config import WanVAEConfig
from ditax.models.vae.wan.layers import Cache, CausalConv3d, RMSNorm

_TAKES_FIRST = (Resample, residual.ResidualDownBlock)  # blocks that resample in time


def _down_blocks(cfg: WanVAEConfig, dims: list[int], *, dtype, rngs) -> list:
    """Wan 2.1 encoder levels, flat: residual blocks, then a downsampler (all but the last)."""
    blocks = []
    for i, (cin, cout) in enumerate(zip(dims[:-1], dims[1:])):
        for _ in range(cfg.num_res_blocks):
            blocks.append(ResidualBlock(cin, cout, dtype=dtype, rngs=rngs))
            cin = cout
        if i != len(cfg.dim_mult) - 1:
            mode = "downsample3d" if cfg.temperal_downsample[i] else "downsample2d"
            blocks.append(Resample(cout, mode, dtype=dtype, rngs=rngs))
    return blocks


def _up_blocks(cfg: WanVAEConfig, dims: list[int], *, dtype, rngs) -> list[UpBlock]:
    """Wan 2.1 decoder levels; every upsampler's 2-D conv halves the channels."""
    temperal_upsample = cfg.temperal_downsample[::-1]
    blocks = []
    for i, (cin, cout) in enumerate(zip(dims[:-1], dims[1:])):
        if i > 0:
            cin //= 2  # the previous upsampler's 2-D conv halves the channels
        mode = None
        if i != len(cfg.dim_mult) - 1:
            mode = "upsample3d" if temperal_upsample[i] else "upsample2d"
        blocks.append(UpBlock(cin, cout, cfg.num_res_blocks, mode, dtype=dtype, rngs=rngs))
    return blocks


class Encoder(nnx.Module):
    """Video ``[B, F, H, W, in_channels]`` → ``[B, F', Y, X, 2 z_dim]`` (mean and log-variance);
    ``Y = H / 2^(len(dim_mult) - 1)`` (8x for Wan 2.1, and on the 2x2 patches for Wan 2.2)."""

    def __init__(self, cfg: WanVAEConfig, *, dtype, rngs):
        dims = [cfg.base_dim * u for u in (1, *cfg.dim_mult)]
        self.conv_in = CausalConv3d(cfg.in_channels, dims[0], 3, padding=1, dtype=dtype, rngs=rngs)
        make = residual.down_blocks if cfg.is_residual else _down_blocks
        self.down_blocks = nnx.List(make(cfg, dims, dtype=dtype, rngs=rngs))
        self.mid_block = MidBlock(dims[-1], dtype=dtype, rngs=rngs)
        self.norm_out = RMSNorm(dims[-1], dtype=dtype)
        self.conv_out = CausalConv3d(dims[-1], 2 * cfg.z_dim, 3, padding=1, dtype=dtype, rngs=rngs)

    def __call__(self, x: jax.Array, cache: Cache, first: bool):
        cache = cache or {"down_blocks": [None] * len(self.down_blocks)}
        x, c_in = self.conv_in(x, cache.get("conv_in"))
        c_down = []
        for layer, c in zip(self.down_blocks, cache["down_blocks"]):
            x, c = layer(x, c, first) if isinstance(layer, _TAKES_FIRST) else layer(x, c)
            c_down.append(c)
        x, c_mid = self.mid_block(x, cache.get("mid_block"))
        x, c_out = self.conv_out(jax.nn.silu(self.norm_out(x)), cache.get("conv_out"))
        return x, {"conv_in": c_in, "down_blocks": c_down, "mid_block": c_mid, "conv_out": c_out}


class Decoder(nnx.Module):
    """Latent ``[B, F', Y, X, z_dim]`` → ``[B, 1 + 4 (F' - 1), 8Y, 8X, out_channels]`` (unclipped;
    8 = 2^(len(dim_mult) - 1), 4 = the temporal factor)."""

    def __init__(self, cfg: WanVAEConfig, *, dtype, rngs):
        base = cfg.decoder_base_dim or cfg.base_dim
        mult = cfg.dim_mult
        dims = [base * u for u in (mult[-1], *mult[::-1])]
        self.conv_in = CausalConv3d(cfg.z_dim, dims[0], 3, padding=1, dtype=dtype, rngs=rngs)
        self.mid_block = MidBlock(dims[0], dtype=dtype, rngs=rngs)
        make = residual.up_blocks if cfg.is_residual else _up_blocks
        self.up_blocks = nnx.List(make(cfg, dims, dtype=dtype, rngs=rngs))
        self.norm_out = RMSNorm(dims[-1], dtype=dtype)
        self.conv_out = CausalConv3d(dims[-1], cfg.out_channels, 3, padding=1, dtype=dtype, rngs=rngs)

    def __call__(self, x: jax.Array, cache: Cache, first: bool):
        cache = cache or {"up_blocks": [None] * len(self.up_blocks)}
        x, c_in = self.conv_in.fused(x, cache.get("conv_in"))
        x, c_mid = self.mid_block(x, cache.get("mid_block"))
        c_up = []
        for block, c in zip(self.up_blocks, cache["up_blocks"]):
            x, c = block(x, c, first)
            c_up.append(c)
        x, c_out = self.conv_out.fused(jax.nn.silu(self.norm_out(x)), cache.get("conv_out"))
        return x, {"conv_in": c_in, "mid_block": c_mid, "up_blocks": c_up, "conv_out": c_out}
