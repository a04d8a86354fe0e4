"""Primitive layers of the image VAE, channels-last ``[B, Y, X, C]``: 2-D convolution and
GroupNorm, with the parameter names of torch's ``nn.Conv2d`` / ``nn.GroupNorm`` (``weight``,
``bias``) so the weights table is the module path (see :mod:`.convert`).

Both are pure functions of their parameters (``nnx.split`` gives the pytree, ``nnx.merge`` the
apply), so a trainer differentiates them like any other module.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.nn import halo


class Conv2d(nnx.Module):
    """``nn.Conv2d``: weight ``[kh, kw, C_in, C_out]`` (torch ``[O, I, kh, kw]`` transposed),
    bias ``[C_out]``; ``padding`` is ``((top, bottom), (left, right))`` zeros. Computes in the
    parameters' dtype."""

    def __init__(self, cin: int, cout: int, kernel: int = 3, stride: int = 1, padding=None, *,
                 dtype, rngs: nnx.Rngs):
        pad = kernel // 2
        self.stride = (stride, stride)
        self.padding = padding if padding is not None else ((pad, pad), (pad, pad))
        fan_in = cin * kernel * kernel
        w = jax.random.normal(rngs.params(), (kernel, kernel, cin, cout), jnp.float32)
        self.weight = nnx.Param((w / math.sqrt(fan_in)).astype(dtype))
        self.bias = nnx.Param(jnp.zeros((cout,), dtype))

    def __call__(self, x: jax.Array) -> jax.Array:
        """x ``[B, Y, X, C_in]`` → ``[B, Y', X', C_out]``."""
        w = self.weight[...]
        x, pad_y = halo.rows(x, self.padding[0])  # neighbours' rows when the image is row-split
        y = jax.lax.conv_general_dilated(
            x.astype(w.dtype), w, window_strides=self.stride,
            padding=(pad_y, tuple(self.padding[1])),
            dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return y + self.bias[...]


class GroupNorm(nnx.Module):
    """``nn.GroupNorm(groups, C, eps, affine=True)`` over ``[B, Y, X, C]``: mean and biased
    variance of each group of ``C / groups`` consecutive channels over all pixels, in float32;
    returns ``x.dtype``."""

    def __init__(self, groups: int, dim: int, eps: float = 1e-6, *, dtype):
        self.groups = groups
        self.eps = eps
        self.weight = nnx.Param(jnp.ones((dim,), dtype))
        self.bias = nnx.Param(jnp.zeros((dim,), dtype))

    def __call__(self, x: jax.Array) -> jax.Array:
        b, c = x.shape[0], x.shape[-1]
        if halo.active() is None:
            xf = x.astype(jnp.float32).reshape(b, -1, self.groups, c // self.groups)
            mean = jnp.mean(xf, axis=(1, 3), keepdims=True)
            var = jnp.mean(jnp.square(xf - mean), axis=(1, 3), keepdims=True)
        else:  # rows split over devices: statistics of the whole image's real rows
            xf = x.astype(jnp.float32).reshape(*x.shape[:-1], self.groups, c // self.groups)
            axes = (1, 2, 4)
            mean = halo.row_mean(xf, axes, row_axis=1)
            var = halo.row_mean(jnp.square(xf - mean), axes, row_axis=1)
        y = ((xf - mean) * jax.lax.rsqrt(var + self.eps)).reshape(x.shape)
        y = y * self.weight[...].astype(jnp.float32) + self.bias[...].astype(jnp.float32)
        return y.astype(x.dtype)


__all__ = ["Conv2d", "GroupNorm"]
