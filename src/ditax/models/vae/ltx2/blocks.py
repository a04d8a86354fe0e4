"""Blocks of LTX-2's video VAE (diffusers ``LTX2VideoResnetBlock3d``, ``LTX2VideoDownsampler3d``,
``LTX2VideoUpsampler3d``, ``LTX2VideoDownBlock3D``, ``LTX2VideoMidBlock3d``,
``LTX2VideoUpBlock3d``), channels-last ``[B, F, Y, X, C]``.

Every block takes ``causal`` (the coder's setting) and, in a timestep-conditioned decoder, the
scaled timestep ``t`` ``[B]``: a block with a ``time_embedder`` embeds it (sinusoid of 256 →
MLP to ``4 C``) and its resnets add the embedding plus their ``scale_shift_table`` ``[4, C]``
as shift / scale after each norm. Attribute paths are the diffusers state-dict keys.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.models.vae.ltx2.config import STRIDES
from ditax.models.vae.ltx2.layers import CausalConv3d, Pointwise, rms_norm
from ditax.models.vae.ltx2.shuffle import fold, group_mean, unfold
from ditax.nn import FP32LayerNorm, TimestepEmbedding, timestep_embedding

TIME_PROJ_DIM = 256   # diffusers' PixArtAlphaCombinedTimestepSizeEmbeddings sinusoid width


def shift_scale_table(rows: int, dim: int, dtype, rngs) -> nnx.Param:
    """A ``scale_shift_table`` ``[rows, dim]`` (diffusers' init: normal / sqrt(dim))."""
    w = jax.random.normal(rngs.params(), (rows, dim), jnp.float32) / dim ** 0.5
    return nnx.Param(w.astype(dtype))


def modulate(x: jax.Array, shift: jax.Array, scale: jax.Array) -> jax.Array:
    """``x * (1 + scale) + shift`` with per-sample ``[B, C]`` shift / scale."""
    return x * (1 + scale[:, None, None, None, :]) + shift[:, None, None, None, :]


class TimeEmbedder(nnx.Module):
    """diffusers ``PixArtAlphaCombinedTimestepSizeEmbeddings(dim, 0)``: timestep ``[B]`` →
    sinusoid (cos half first) → ``linear_1`` → SiLU → ``linear_2`` → ``[B, dim]``."""

    def __init__(self, dim: int, *, dtype, rngs):
        self.timestep_embedder = TimestepEmbedding(TIME_PROJ_DIM, dim, dtype=dtype,
                                                   param_dtype=dtype, rngs=rngs)

    def __call__(self, t: jax.Array, dtype) -> jax.Array:
        return self.timestep_embedder(timestep_embedding(t, TIME_PROJ_DIM).astype(dtype))


class ResnetBlock(nnx.Module):
    """RMS norm → (shift / scale) → SiLU → conv → RMS norm → (shift / scale) → SiLU → conv, plus
    the input (through LayerNorm and a 1x1x1 conv when the width changes)."""

    def __init__(self, cin: int, cout: int, *, eps: float, padding_mode: str, timestep: bool,
                 dtype, rngs):
        conv = dict(padding_mode=padding_mode, dtype=dtype, rngs=rngs)
        self.conv1 = CausalConv3d(cin, cout, **conv)
        self.conv2 = CausalConv3d(cout, cout, **conv)
        wide = cin != cout
        self.norm3 = FP32LayerNorm(cin, eps, affine=True, param_dtype=dtype) if wide else None
        self.conv_shortcut = Pointwise(cin, cout, dtype=dtype, rngs=rngs) if wide else None
        self.scale_shift_table = shift_scale_table(4, cin, dtype, rngs) if timestep else None

    def __call__(self, x: jax.Array, temb: jax.Array | None, causal: bool) -> jax.Array:
        """``[B, F, Y, X, C_in]`` → ``[B, F, Y, X, C_out]``; ``temb`` ``[B, 4 C]`` (the block's
        embedded timestep) when the block is conditioned."""
        h = rms_norm(x)
        if self.scale_shift_table is not None:
            mod = temb.reshape(temb.shape[0], 4, -1) + self.scale_shift_table[...][None]
            shift1, scale1, shift2, scale2 = (mod[:, i].astype(x.dtype) for i in range(4))
            h = modulate(h, shift1, scale1)
        h = self.conv1(jax.nn.silu(h), causal)
        h = rms_norm(h)
        if self.scale_shift_table is not None:
            h = modulate(h, shift2, scale2)
        h = self.conv2(jax.nn.silu(h), causal)
        if self.norm3 is not None:
            x = self.conv_shortcut(self.norm3(x).astype(x.dtype))
        return h + x


class Downsampler(nnx.Module):
    """Space-to-depth by ``STRIDES[kind]`` (the first ``st - 1`` frames repeated in front, so
    frame 0 keeps a latent frame of its own): a conv to ``cout / (st sh sw)`` channels then
    folded, plus the folded input averaged down to ``cout`` channels."""

    def __init__(self, cin: int, cout: int, kind: str, *, padding_mode: str, dtype, rngs):
        self.stride = STRIDES[kind]
        self.cout = cout
        n = self.stride[0] * self.stride[1] * self.stride[2]
        self.conv = CausalConv3d(cin, cout // n, padding_mode=padding_mode, dtype=dtype, rngs=rngs)

    def __call__(self, x: jax.Array, causal: bool) -> jax.Array:
        """``[B, F, Y, X, C_in]`` → ``[B, (F + st - 1) / st, Y / sh, X / sw, C_out]``."""
        st = self.stride[0]
        x = jnp.concatenate([x[:, :st - 1], x], axis=1)
        shortcut = group_mean(fold(x, self.stride), self.cout)
        return fold(self.conv(x, causal), self.stride) + shortcut


class Upsampler(nnx.Module):
    """Depth-to-space by ``STRIDES[kind]``: a conv of ``C_in`` to ``C_in st sh sw / factor``
    channels, unfolded to ``C_in / factor``, the first ``st - 1`` frames dropped (frame 0 stays
    one frame); ``residual`` adds the input unfolded and its channels tiled to match."""

    def __init__(self, cin: int, kind: str, residual: bool, factor: int, *, padding_mode: str,
                 dtype, rngs):
        self.stride = STRIDES[kind]
        self.residual = residual
        self.repeats = self.stride[0] * self.stride[1] * self.stride[2] // factor
        self.conv = CausalConv3d(cin, cin * self.repeats, padding_mode=padding_mode, dtype=dtype,
                                 rngs=rngs)

    def __call__(self, x: jax.Array, causal: bool) -> jax.Array:
        """``[B, F, Y, X, C_in]`` → ``[B, F st - st + 1, Y sh, X sw, C_in / factor]``."""
        drop = self.stride[0] - 1
        h = unfold(self.conv(x, causal), self.stride)[:, drop:]
        if self.residual:
            r = unfold(x, self.stride)[:, drop:]
            h = h + jnp.tile(r, (1, 1, 1, 1, self.repeats))
        return h


def _resnets(n: int, dim: int, **kw) -> nnx.List:
    return nnx.List([ResnetBlock(dim, dim, **kw) for _ in range(n)])


class DownBlock(nnx.Module):
    """``layers`` resnets at ``cin``, then an optional :class:`Downsampler` to ``cout``."""

    def __init__(self, cin: int, cout: int, layers: int, down: str | None, *, eps: float,
                 padding_mode: str, dtype, rngs):
        self.resnets = _resnets(layers, cin, eps=eps, padding_mode=padding_mode, timestep=False,
                                dtype=dtype, rngs=rngs)
        self.downsamplers = None if down is None else nnx.List([
            Downsampler(cin, cout, down, padding_mode=padding_mode, dtype=dtype, rngs=rngs)])

    def __call__(self, x: jax.Array, causal: bool) -> jax.Array:
        for r in self.resnets:
            x = r(x, None, causal)
        if self.downsamplers is not None:
            x = self.downsamplers[0](x, causal)
        return x


class MidBlock(nnx.Module):
    """``layers`` resnets at ``dim``; with ``timestep``, its own time embedder (``4 dim``)."""

    def __init__(self, dim: int, layers: int, *, eps: float, padding_mode: str, timestep: bool,
                 dtype, rngs):
        self.time_embedder = TimeEmbedder(4 * dim, dtype=dtype, rngs=rngs) if timestep else None
        self.resnets = _resnets(layers, dim, eps=eps, padding_mode=padding_mode,
                                timestep=timestep, dtype=dtype, rngs=rngs)

    def __call__(self, x: jax.Array, t: jax.Array | None, causal: bool) -> jax.Array:
        temb = None if self.time_embedder is None else self.time_embedder(t, x.dtype)
        for r in self.resnets:
            x = r(x, temb, causal)
        return x


class UpBlock(nnx.Module):
    """A ``cin → cout`` resnet (``conv_in``, when they differ), an optional :class:`Upsampler`
    over ``cout * factor`` channels, then ``layers`` resnets at ``cout``; with ``timestep``, a
    time embedder of ``4 cin`` (the config rules keep ``cin == cout`` then)."""

    def __init__(self, level, *, eps: float, padding_mode: str, timestep: bool, dtype, rngs):
        kw = dict(eps=eps, padding_mode=padding_mode, dtype=dtype, rngs=rngs)
        self.time_embedder = (TimeEmbedder(4 * level.cin, dtype=dtype, rngs=rngs)
                              if timestep else None)
        self.conv_in = (ResnetBlock(level.cin, level.cout, timestep=timestep, **kw)
                        if level.cin != level.cout else None)
        self.upsamplers = None if level.up is None else nnx.List([
            Upsampler(level.cout * level.factor, level.up, level.residual, level.factor,
                      padding_mode=padding_mode, dtype=dtype, rngs=rngs)])
        self.resnets = _resnets(level.layers, level.cout, timestep=timestep, **kw)

    def __call__(self, x: jax.Array, t: jax.Array | None, causal: bool) -> jax.Array:
        if self.conv_in is not None:
            x = self.conv_in(x, None, causal)   # never conditioned (see the config rules)
        temb = None if self.time_embedder is None else self.time_embedder(t, x.dtype)
        if self.upsamplers is not None:
            x = self.upsamplers[0](x, causal)
        for r in self.resnets:
            x = r(x, temb, causal)
        return x


__all__ = ["DownBlock", "Downsampler", "MidBlock", "ResnetBlock", "TimeEmbedder", "UpBlock",
           "Upsampler", "modulate", "shift_scale_table"]
