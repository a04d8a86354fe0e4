"""Primitive layers of the Wan VAE, channels-last ``[B, F, Y, X, C]``.

Causal 3-D convolution (with the feature cache that lets a video be processed in chunks),
per-frame 2-D convolution, pointwise projection and the VAE's RMS norm. Parameter names match
the diffusers state-dict keys (see ``convert.py``).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.nn import halo
from ditax.parallel.platform import platform_of

CACHE_FRAMES = 2  # frames of left context kept per causal conv (diffusers CACHE_T)

Cache = Any  # nested dict/list of arrays [B, frames, Y, X, C] or None


def _triple(v) -> tuple[int, int, int]:
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v, v)


def _init(rngs: nnx.Rngs, shape, fan_in: int, dtype) -> nnx.Param:
    return nnx.Param(jax.random.normal(rngs.params(), shape, jnp.float32).astype(dtype) / math.sqrt(fan_in))


class CausalConv3d(nnx.Module):
    """3-D convolution that is causal in time: ``2 * padding_t`` frames of left context.

    The left context comes from ``cache`` (the previous chunk's last input frames) or, at the
    start of the stream (``cache=None``), zeros. Spatial padding is symmetric zeros.
    weight ``[kt, kh, kw, C_in, C_out]``, bias ``[C_out]``.
    """

    def __init__(self, cin: int, cout: int, kernel, stride=1, padding=0, *, dtype, rngs: nnx.Rngs):
        kernel, stride, padding = _triple(kernel), _triple(stride), _triple(padding)
        self.stride = stride
        self.context = 2 * padding[0]
        self.pad_yx = (padding[1], padding[2])
        self.weight = _init(rngs, (*kernel, cin, cout), cin * math.prod(kernel), dtype)
        self.bias = nnx.Param(jnp.zeros((cout,), dtype))

    def conv(self, x: jax.Array) -> jax.Array:
        """Plain convolution with no temporal padding. x ``[B, F, Y, X, C]``.

        On CPU it runs as ``kt`` per-frame 2-D convolutions summed over the kernel's time taps
        (:func:`conv3d_by_frames`): XLA's CPU 3-D convolution is 2.5-4x slower than that,
        forward and backward (measured at 8-64 channels). Elsewhere one 3-D convolution."""
        py, px = self.pad_yx
        x, pad_y = halo.rows(x, (py, py))  # neighbours' rows when the frame is row-split
        if platform_of().name == "cpu":
            y = conv3d_by_frames(x, self.weight[...], self.stride, (pad_y, (px, px)))
        else:
            y = jax.lax.conv_general_dilated(
                x, self.weight[...], window_strides=self.stride,
                padding=[(0, 0), pad_y, (px, px)], dimension_numbers=("NDHWC", "DHWIO", "NDHWC"))
        return y + self.bias[...]

    def __call__(self, x: jax.Array, cache: jax.Array | None = None):
        """x ``[B, F, Y, X, C]``, cache ``[B, context, Y, X, C]`` or None → (y, new cache)."""
        if not self.context:
            return self.conv(x), None
        if cache is None:
            cache = jnp.zeros((x.shape[0], self.context, *x.shape[2:]), x.dtype)
        xc = jnp.concatenate([cache.astype(x.dtype), x], axis=1)
        return self.conv(xc), xc[:, -self.context:]


def conv3d_by_frames(x: jax.Array, w: jax.Array, stride, pad_yx) -> jax.Array:
    """Valid-in-time 3-D convolution as a sum over the kernel's ``kt`` time taps of 2-D
    convolutions of strided frame slices (frames folded into the batch). x ``[B, F, Y, X, C]``,
    w ``[kt, kh, kw, C, C_out]``, ``pad_yx`` ``((top, bottom), (left, right))``; the same sums
    as one 3-D convolution in another order."""
    kt = w.shape[0]
    st, sy, sx = stride
    b, f = x.shape[:2]
    fo = (f - kt) // st + 1
    out = None
    for t in range(kt):
        xt = x[:, t:t + st * (fo - 1) + 1:st]
        yt = jax.lax.conv_general_dilated(
            xt.reshape(b * fo, *x.shape[2:]), w[t], window_strides=(sy, sx),
            padding=[tuple(pad_yx[0]), tuple(pad_yx[1])],
            dimension_numbers=("NHWC", "HWIO", "NHWC"))
        out = yt if out is None else out + yt
    return out.reshape(b, fo, *out.shape[1:])


class Conv2d(nnx.Module):
    """Per-frame 2-D convolution. weight ``[kh, kw, C_in, C_out]``, bias ``[C_out]``."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, padding, *, dtype, rngs):
        self.stride = (stride, stride)
        self.padding = padding  # ((top, bottom), (left, right))
        self.weight = _init(rngs, (kernel, kernel, cin, cout), cin * kernel * kernel, dtype)
        self.bias = nnx.Param(jnp.zeros((cout,), dtype))

    def __call__(self, x: jax.Array) -> jax.Array:
        """x ``[B, F, Y, X, C]`` → ``[B, F, Y', X', C_out]``."""
        b, f = x.shape[:2]
        x, pad_y = halo.rows(x, self.padding[0])  # neighbours' rows when the frame is row-split
        y = jax.lax.conv_general_dilated(
            x.reshape(b * f, *x.shape[2:]), self.weight[...], window_strides=self.stride,
            padding=(pad_y, tuple(self.padding[1])), dimension_numbers=("NHWC", "HWIO", "NHWC"))
        y = y + self.bias[...]
        return y.reshape(b, f, *y.shape[1:])


class Dense(nnx.Module):
    """Pointwise projection (diffusers' 1x1 ``Conv2d``). weight ``[C_in, C_out]``."""

    def __init__(self, cin: int, cout: int, *, dtype, rngs):
        self.weight = _init(rngs, (cin, cout), cin, dtype)
        self.bias = nnx.Param(jnp.zeros((cout,), dtype))

    def __call__(self, x: jax.Array) -> jax.Array:
        return x @ self.weight[...] + self.bias[...]


class RMSNorm(nnx.Module):
    """Channel L2 normalisation times ``sqrt(C) * gamma`` (diffusers ``WanRMS_norm``, no bias).

    Normalises in float32 (eps 1e-12 on the norm, like ``F.normalize``). x ``[..., C]``.
    """

    def __init__(self, dim: int, *, dtype):
        self.scale = dim ** 0.5
        self.gamma = nnx.Param(jnp.ones((dim,), dtype))

    def __call__(self, x: jax.Array) -> jax.Array:
        xf = x.astype(jnp.float32)
        norm = jnp.sqrt(jnp.sum(xf * xf, axis=-1, keepdims=True))
        y = (xf / jnp.maximum(norm, 1e-12)).astype(x.dtype)
        return y * self.scale * self.gamma[...]

