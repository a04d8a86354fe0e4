"""Timestep and text embedders of diffusion transformers (diffusers ``Timesteps``,
``TimestepEmbedding``, ``PixArtAlphaTextProjection``)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.nn.linear import Linear


def timestep_embedding(t, dim: int, max_period: float = 10000.0):
    """Sinusoidal embedding ``[B] → [B, dim]``, cos half first (flip_sin_to_cos, shift 0)."""
    half = dim // 2
    exponent = -math.log(max_period) * jnp.arange(half, dtype=jnp.float32) / half
    args = t.astype(jnp.float32)[:, None] * jnp.exp(exponent)[None, :]
    return jnp.concatenate([jnp.cos(args), jnp.sin(args)], axis=-1)


class TimestepEmbedding(nnx.Module):
    """``linear_1 → SiLU → linear_2`` (diffusers ``TimestepEmbedding``)."""

    def __init__(self, din, dim, *, dtype, param_dtype, rngs):
        self.linear_1 = Linear(din, dim, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.linear_2 = Linear(dim, dim, dtype=dtype, param_dtype=param_dtype, rngs=rngs)

    def __call__(self, x):
        return self.linear_2(jax.nn.silu(self.linear_1(x)))


class TextProjection(nnx.Module):
    """``linear_1 → GELU(tanh) → linear_2`` (diffusers ``PixArtAlphaTextProjection``)."""

    def __init__(self, din, dim, *, dtype, param_dtype, rngs):
        self.linear_1 = Linear(din, dim, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.linear_2 = Linear(dim, dim, dtype=dtype, param_dtype=param_dtype, rngs=rngs)

    def __call__(self, x):
        return self.linear_2(jax.nn.gelu(self.linear_1(x), approximate=True))
