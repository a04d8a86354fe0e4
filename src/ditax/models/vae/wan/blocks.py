"""Blocks of the Wan VAE built from :mod:`.layers`: residual block, per-frame attention,
2x up/down-sampling (optionally in time), the mid block and the decoder's up block.

Every block takes channels-last ``[B, F, Y, X, C]`` and its slice of the feature cache and
returns ``(output, new cache)``; blocks that resample in time also take ``first`` (the first
chunk of a video, which keeps frame 0 a frame of its own).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.models.vae.wan.layers import (CACHE_FRAMES, Cache, CausalConv3d, Conv2d, Dense, RMSNorm,
                                         fast, pad_axis)
from ditax.nn import halo


class ResidualBlock(nnx.Module):
    """norm → SiLU → causal conv → norm → SiLU → causal conv, plus a (1x1x1 conv) shortcut."""

    def __init__(self, cin: int, cout: int, *, dtype, rngs):
        self.norm1 = RMSNorm(cin, dtype=dtype)
        self.conv1 = CausalConv3d(cin, cout, 3, padding=1, dtype=dtype, rngs=rngs)
        self.norm2 = RMSNorm(cout, dtype=dtype)
        self.conv2 = CausalConv3d(cout, cout, 3, padding=1, dtype=dtype, rngs=rngs)
        self.conv_shortcut = CausalConv3d(cin, cout, 1, dtype=dtype, rngs=rngs) if cin != cout else None

    def __call__(self, x: jax.Array, cache: Cache = None):
        """x ``[B, F, Y, X, C_in]`` → (``[B, F, Y, X, C_out]``, cache). The second norm and
        the shortcut's sum ride on the convolutions (:meth:`CausalConv3d.fused`: one kernel
        each on the TPU fast path)."""
        cache = cache or {}
        h = x if self.conv_shortcut is None else self.conv_shortcut(x)[0]
        y, c1 = self.conv1.fused(jax.nn.silu(self.norm1(x)), cache.get("conv1"), act=self.norm2)
        y, c2 = self.conv2.fused(y, cache.get("conv2"), residual=h)
        return y, {"conv1": c1, "conv2": c2}


class AttentionBlock(nnx.Module):
    """Single-head self-attention over the pixels of each frame (no temporal mixing)."""

    def __init__(self, dim: int, *, dtype, rngs):
        self.norm = RMSNorm(dim, dtype=dtype)
        self.to_qkv = Dense(dim, 3 * dim, dtype=dtype, rngs=rngs)
        self.proj = Dense(dim, dim, dtype=dtype, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        """x ``[B, F, Y, X, C]`` → same shape; softmax in float32. With a row split
        (:mod:`ditax.nn.halo`) each device's pixels attend to the keys of the whole frame."""
        c = self.proj.weight.shape[-1]
        if x.shape[-1] != c:  # the fast path's zero-padded channels: attend over the real ones
            return pad_axis(self(x[..., :c]), -1, x.shape[-1])
        b, f, yy, xx, c = x.shape
        q, kv = jnp.split(self.to_qkv(self.norm(x)), [c], axis=-1)
        kv = halo.gather_rows(kv)  # [B, F, Y_all, X, 2C]
        q = q.reshape(b * f, yy * xx, c)
        k, v = jnp.split(kv.reshape(b * f, -1, 2 * c), 2, axis=-1)
        s = jnp.einsum("blc,bmc->blm", q, k, preferred_element_type=jnp.float32) / math.sqrt(c)
        keep = halo.key_mask(yy, xx)
        if keep is not None:
            s = jnp.where(keep, s, -jnp.inf)
        p = jax.nn.softmax(s, axis=-1).astype(v.dtype)
        o = jnp.einsum("blm,bmc->blc", p, v)
        return x + self.proj(o).reshape(b, f, yy, xx, c)


class Resample(nnx.Module):
    """2x spatial up/down-sampling, optionally with 2x temporal up/down-sampling.

    modes: ``upsample2d`` / ``upsample3d`` (nearest 2x then 3x3 conv to ``out_dim``; 3d first
    doubles frames with a causal time conv to 2C channels, skipped on the first chunk so frame 0
    stays one frame), ``downsample2d`` / ``downsample3d`` (pad right/bottom by one, 3x3 conv with
    stride 2; 3d then halves frames with a stride-2 time conv over [previous frame, chunk],
    skipped on the first chunk).
    """

    def __init__(self, dim: int, mode: str, out_dim: int | None = None, *, dtype, rngs):
        self.mode = mode
        if mode.startswith("upsample"):
            self.resample_conv = Conv2d(dim, out_dim or dim // 2, 3, 1, ((1, 1), (1, 1)), dtype=dtype, rngs=rngs)
        elif mode.startswith("downsample"):
            self.resample_conv = Conv2d(dim, dim, 3, 2, ((0, 1), (0, 1)), dtype=dtype, rngs=rngs)
        else:
            raise ValueError(f"Resample: unknown mode {mode!r}")
        if mode == "upsample3d":
            self.time_conv = CausalConv3d(dim, 2 * dim, (3, 1, 1), padding=(1, 0, 0), dtype=dtype, rngs=rngs)
        elif mode == "downsample3d":
            self.time_conv = CausalConv3d(dim, dim, (3, 1, 1), stride=(2, 1, 1), dtype=dtype, rngs=rngs)
        else:
            self.time_conv = None

    def __call__(self, x: jax.Array, cache: Cache, first: bool):
        """x ``[B, F, Y, X, C]`` → (resampled x, cache); ``first`` marks the first chunk."""
        new_cache = None
        if self.mode == "upsample3d":
            b, f, yy, xx, c = x.shape
            if first:
                new_cache = jnp.zeros((b, CACHE_FRAMES, yy, xx, c), x.dtype)
            else:
                y, new_cache = self._time_conv(x, cache)
                # channel halves (h0, h1) of frame i become frames 2i, 2i+1
                x = y.reshape(b, f, yy, xx, 2, c).transpose(0, 1, 4, 2, 3, 5).reshape(b, 2 * f, yy, xx, c)
        if self.mode.startswith("upsample") and fast() is not None:
            return self.resample_conv.upsampled(x), new_cache
        if self.mode.startswith("upsample"):
            x = jnp.repeat(jnp.repeat(x, 2, axis=2), 2, axis=3)
        x = self.resample_conv(x)
        if self.mode == "downsample3d":
            if first:
                new_cache = x[:, -1:]
            else:
                new_cache = x[:, -1:]
                x = self.time_conv.conv(jnp.concatenate([cache.astype(x.dtype), x], axis=1))
        return x, new_cache

    def _time_conv(self, x: jax.Array, cache):
        """The upsampler's time conv (C → 2C: two frames' channels); on the fast path three
        products (a 3x1x1 kernel needs no convolution), each half of the output padded to
        the input's (padded) channels, so the halves stay two whole frames."""
        conv, c = self.time_conv, x.shape[-1]
        dim = conv.weight.shape[3]
        if fast() is None:
            return conv(x, cache)
        w = pad_axis(pad_axis(conv.weight[...].reshape(3, 1, 1, dim, 2, dim), 3, c), 5, c)
        b = pad_axis(conv.bias[...].reshape(2, dim), 1, c)
        if cache is None:
            cache = jnp.zeros((x.shape[0], CACHE_FRAMES, *x.shape[2:]), x.dtype)
        xc = jnp.concatenate([cache.astype(x.dtype), x], 1)
        w = w.reshape(3, c, 2 * c)
        f = x.shape[1]   # three products (one per time tap) instead of a convolution
        y = sum(jnp.einsum("bfyxc,cd->bfyxd", xc[:, t:t + f], w[t],
                           preferred_element_type=jnp.float32) for t in range(3))
        return (y + b.reshape(2 * c)).astype(x.dtype), xc[:, -CACHE_FRAMES:]


class MidBlock(nnx.Module):
    """resnet → attention → resnet at the lowest resolution."""

    def __init__(self, dim: int, *, dtype, rngs):
        self.resnets = nnx.List([ResidualBlock(dim, dim, dtype=dtype, rngs=rngs) for _ in range(2)])
        self.attentions = nnx.List([AttentionBlock(dim, dtype=dtype, rngs=rngs)])

    def __call__(self, x: jax.Array, cache: Cache = None):
        cache = cache or [None, None]
        x, c0 = self.resnets[0](x, cache[0])
        x = self.attentions[0](x)
        x, c1 = self.resnets[1](x, cache[1])
        return x, [c0, c1]

class UpBlock(nnx.Module):
    """``num_res_blocks + 1`` residual blocks, then an optional upsampler."""

    def __init__(self, cin: int, cout: int, num_res_blocks: int, mode: str | None, *, dtype, rngs):
        res = []
        for _ in range(num_res_blocks + 1):
            res.append(ResidualBlock(cin, cout, dtype=dtype, rngs=rngs))
            cin = cout
        self.resnets = nnx.List(res)
        self.upsamplers = nnx.List([Resample(cout, mode, dtype=dtype, rngs=rngs)]) if mode else None

    def __call__(self, x: jax.Array, cache: Cache, first: bool):
        cache = cache or {"resnets": [None] * len(self.resnets)}
        c_res = []
        for layer, c in zip(self.resnets, cache["resnets"]):
            x, c = layer(x, c)
            c_res.append(c)
        c_up = None
        if self.upsamplers is not None:
            x, c_up = self.upsamplers[0](x, cache.get("upsampler"), first)
        return x, {"resnets": c_res, "upsampler": c_up}
