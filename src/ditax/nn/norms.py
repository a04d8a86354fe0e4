"""Norms over the last axis that compute in float32 (as the diffusers references do)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


class RMSNorm(nnx.Module):
    """RMS norm over the last axis with a learned ``scale``, float32 inside, ``x.dtype`` out."""

    def __init__(self, dim: int, eps: float, *, param_dtype):
        self.scale = nnx.Param(jnp.ones((dim,), jnp.dtype(param_dtype)))
        self.eps = eps

    def __call__(self, x):
        xf = x.astype(jnp.float32)
        y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        return (y * self.scale[...].astype(jnp.float32)).astype(x.dtype)


def layer_norm(x, eps: float):
    """``x`` normalized over its last axis in float32 (mean 0, variance 1, no affine terms):
    :class:`FP32LayerNorm`'s steps, and the fused projections' input norm's
    (:mod:`ditax.nn.head_projection`)."""
    xf = x.astype(jnp.float32)
    mu = jnp.mean(xf, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(xf - mu), axis=-1, keepdims=True)
    return (xf - mu) * jax.lax.rsqrt(var + eps)


class FP32LayerNorm(nnx.Module):
    """LayerNorm computed in float32 (optionally affine); returns float32 like the reference."""

    def __init__(self, dim: int, eps: float, *, affine: bool, param_dtype):
        self.eps = eps
        if affine:
            pd = jnp.dtype(param_dtype)
            self.scale = nnx.Param(jnp.ones((dim,), pd))
            self.bias = nnx.Param(jnp.zeros((dim,), pd))
        else:
            self.scale = None
            self.bias = None

    def __call__(self, x):
        y = layer_norm(x, self.eps)
        if self.scale is not None:
            y = y * self.scale[...].astype(jnp.float32) + self.bias[...].astype(jnp.float32)
        return y
