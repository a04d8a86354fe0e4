"""Encoder and decoder of LTX-2's audio VAE (diffusers ``LTX2AudioEncoder`` /
``LTX2AudioDecoder``), channels-last ``[B, T, M, C]``.

Encoder: causal ``conv_in`` → one level per ``ch_mult`` entry (``num_res_blocks`` residual
blocks to ``base_channels * mult``, attention after each when the level's resolution is in
``attn_resolutions``, a :class:`~.audio_blocks.Downsample` but on the last level) → ``mid``
(resnet, attention when ``mid_block_add_attention``, resnet) → norm → SiLU → causal ``conv_out``
to ``2 * latent_channels`` (posterior mean and log-variance).

Decoder: causal ``conv_in`` → ``mid`` → the levels from the last to the first
(``num_res_blocks + 1`` residual blocks each, an :class:`~.audio_blocks.Upsample` but on level 0;
diffusers stores them as ``up[level]``) → norm → SiLU → causal ``conv_out``, then cut (or
zero-padded) to ``max(4F - 3, 1)`` frames and ``mel_bins`` bins as diffusers does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.models.ltx2.audio.blocks import AttnBlock, Downsample, ResnetBlock, Upsample
from ditax.models.ltx2.audio.config import GROUPS, LATENT_FACTOR, LTX2AudioVAEConfig
from ditax.models.ltx2.audio.layers import CausalConv2d, make_norm


class Level(nnx.Module):
    """One level: ``blocks`` residual blocks ``cin → cout`` (diffusers ``block``), an attention
    block after each when ``attend`` (``attn``), and the level's resampler (``downsample`` or
    ``upsample``, None on the deepest / first level)."""

    def __init__(self, cfg: LTX2AudioVAEConfig, cin: int, cout: int, blocks: int, attend: bool,
                 resample: str | None, *, dtype, rngs, attention: str):
        kw = dict(dtype=dtype, rngs=rngs)
        nt, axis = cfg.norm_type, cfg.causality_axis
        self.block = nnx.List([ResnetBlock(cin if i == 0 else cout, cout, nt, axis, GROUPS, **kw)
                               for i in range(blocks)])
        self.attn = (nnx.List([AttnBlock(cout, nt, GROUPS, attention=attention, **kw)
                               for _ in range(blocks)]) if attend else None)
        self.downsample = Downsample(cout, axis, **kw) if resample == "down" else None
        self.upsample = Upsample(cout, axis, **kw) if resample == "up" else None

    def __call__(self, x: jax.Array) -> jax.Array:
        for i, block in enumerate(self.block):
            x = block(x)
            if self.attn is not None:
                x = self.attn[i](x)
        if self.downsample is not None:
            x = self.downsample(x)
        if self.upsample is not None:
            x = self.upsample(x)
        return x


class Mid(nnx.Module):
    """resnet (``block_1``) → attention (``attn_1``, when ``mid_block_add_attention``) → resnet
    (``block_2``) at the lowest resolution."""

    def __init__(self, cfg: LTX2AudioVAEConfig, dim: int, *, dtype, rngs, attention: str):
        kw = dict(dtype=dtype, rngs=rngs)
        nt, axis = cfg.norm_type, cfg.causality_axis
        self.block_1 = ResnetBlock(dim, dim, nt, axis, GROUPS, **kw)
        self.attn_1 = (AttnBlock(dim, nt, GROUPS, attention=attention, **kw)
                       if cfg.mid_block_add_attention else None)
        self.block_2 = ResnetBlock(dim, dim, nt, axis, GROUPS, **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.block_1(x)
        if self.attn_1 is not None:
            x = self.attn_1(x)
        return self.block_2(x)


class Encoder(nnx.Module):
    """Mel ``[B, T, M, in_channels]`` → moments ``[B, T', M', 2 latent_channels]``."""

    def __init__(self, cfg: LTX2AudioVAEConfig, *, dtype, rngs, attention: str = "xla"):
        kw = dict(dtype=dtype, rngs=rngs)
        widths, axis, n = cfg.widths, cfg.causality_axis, len(cfg.ch_mult)
        self.conv_in = CausalConv2d(cfg.in_channels, cfg.base_channels, 3, axis, **kw)
        levels, cin, res = [], cfg.base_channels, cfg.resolution
        for i, w in enumerate(widths):
            levels.append(Level(cfg, cin, w, cfg.num_res_blocks, res in cfg.attention_resolutions,
                                "down" if i < n - 1 else None, attention=attention, **kw))
            cin, res = w, (res // 2 if i < n - 1 else res)
        self.down = nnx.List(levels)
        self.mid = Mid(cfg, widths[-1], attention=attention, **kw)
        self.norm_out = make_norm(cfg.norm_type, widths[-1], GROUPS, dtype=dtype)
        self.conv_out = CausalConv2d(widths[-1], 2 * cfg.latent_channels, 3, axis, **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.conv_in(x)
        for level in self.down:
            x = level(x)
        return self.conv_out(jax.nn.silu(self.norm_out(self.mid(x))))


class Decoder(nnx.Module):
    """Latents ``[B, F, M', latent_channels]`` → mel ``[B, max(4F - 3, 1), mel_bins,
    output_channels]`` (``mel_bins`` null: as many bins as the latents have, as diffusers)."""

    def __init__(self, cfg: LTX2AudioVAEConfig, *, dtype, rngs, attention: str = "xla"):
        kw = dict(dtype=dtype, rngs=rngs)
        self.mel_bins = cfg.mel_bins
        widths, axis, n = cfg.widths, cfg.causality_axis, len(cfg.ch_mult)
        self.conv_in = CausalConv2d(cfg.latent_channels, widths[-1], 3, axis, **kw)
        self.mid = Mid(cfg, widths[-1], attention=attention, **kw)
        levels, cin, res = {}, widths[-1], cfg.resolution // 2 ** (n - 1)
        for i in reversed(range(n)):     # built deepest first, stored by level as diffusers
            levels[i] = Level(cfg, cin, widths[i], cfg.num_res_blocks + 1,
                              res in cfg.attention_resolutions, "up" if i > 0 else None,
                              attention=attention, **kw)
            cin, res = widths[i], (res * 2 if i > 0 else res)
        self.up = nnx.List([levels[i] for i in range(n)])
        self.norm_out = make_norm(cfg.norm_type, widths[0], GROUPS, dtype=dtype)
        self.conv_out = CausalConv2d(widths[0], cfg.output_channels, 3, axis, **kw)

    def __call__(self, z: jax.Array) -> jax.Array:
        frames, bins = z.shape[1], z.shape[2]
        x = self.mid(self.conv_in(z))
        for i in reversed(range(len(self.up))):
            x = self.up[i](x)
        x = self.conv_out(jax.nn.silu(self.norm_out(x)))
        # diffusers' fixed target: 4 mel frames a latent frame, less the 3 a causal start lacks
        target = (max(frames * LATENT_FACTOR - (LATENT_FACTOR - 1), 1),
                  self.mel_bins if self.mel_bins is not None else bins)
        x = x[:, :target[0], :target[1]]
        pad = ((0, 0), (0, target[0] - x.shape[1]), (0, target[1] - x.shape[2]), (0, 0))
        return jnp.pad(x, pad) if any(p[1] for p in pad) else x


__all__ = ["Decoder", "Encoder", "Level", "Mid"]
