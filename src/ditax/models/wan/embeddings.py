"""Wan embeddings: sinusoidal timesteps, condition embedder, 3-D RoPE, norms, linear layers.

Module and parameter names mirror diffusers' ``WanTransformer3DModel`` so that conversion is a
table (DESIGN rule 7). Norms compute in float32 and cast back, as the reference does.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def as_dtype(d):
    return DTYPES[d] if isinstance(d, str) else d


def _lecun_normal():
    return nnx.initializers.lecun_normal()


class Linear(nnx.Module):
    """``y = x @ kernel + bias``; kernel ``[in, out]`` (torch ``weight.T``), compute in ``dtype``."""

    def __init__(self, din: int, dout: int, *, dtype, param_dtype, rngs: nnx.Rngs, bias=True):
        self.kernel = nnx.Param(_lecun_normal()(rngs.params(), (din, dout), as_dtype(param_dtype)))
        self.bias = nnx.Param(jnp.zeros((dout,), as_dtype(param_dtype))) if bias else None
        self.dtype = as_dtype(dtype)

    def __call__(self, x):
        y = jnp.einsum("...i,io->...o", x.astype(self.dtype), self.kernel[...].astype(self.dtype))
        if self.bias is not None:
            y = y + self.bias[...].astype(self.dtype)
        return y


class RMSNorm(nnx.Module):
    """RMS norm over the last axis (Wan: across all heads, width D), float32 inside."""

    def __init__(self, dim: int, eps: float, *, param_dtype):
        self.scale = nnx.Param(jnp.ones((dim,), as_dtype(param_dtype)))
        self.eps = eps

    def __call__(self, x):
        xf = x.astype(jnp.float32)
        y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        return (y * self.scale[...].astype(jnp.float32)).astype(x.dtype)


class FP32LayerNorm(nnx.Module):
    """LayerNorm computed in float32 (optionally affine); returns float32 like the reference."""

    def __init__(self, dim: int, eps: float, *, affine: bool, param_dtype):
        self.eps = eps
        if affine:
            self.scale = nnx.Param(jnp.ones((dim,), as_dtype(param_dtype)))
            self.bias = nnx.Param(jnp.zeros((dim,), as_dtype(param_dtype)))
        else:
            self.scale = None
            self.bias = None

    def __call__(self, x):
        xf = x.astype(jnp.float32)
        mu = jnp.mean(xf, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(xf - mu), axis=-1, keepdims=True)
        y = (xf - mu) * jax.lax.rsqrt(var + self.eps)
        if self.scale is not None:
            y = y * self.scale[...].astype(jnp.float32) + self.bias[...].astype(jnp.float32)
        return y


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


class ConditionEmbedder(nnx.Module):
    """Timestep → (temb ``[B, D]``, 6-way modulation ``[B, 6, D]``); text ``[B, T, Dt] → [B, T, D]``."""

    def __init__(self, dim, freq_dim, text_dim, *, dtype, param_dtype, rngs):
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.freq_dim = freq_dim
        self.time_embedder = TimestepEmbedding(freq_dim, dim, **kw)
        self.time_proj = Linear(dim, 6 * dim, **kw)
        self.text_embedder = TextProjection(text_dim, dim, **kw)

    def __call__(self, timestep, text):
        t = timestep_embedding(timestep, self.freq_dim)
        temb = self.time_embedder(t).astype(text.dtype)
        mod = self.time_proj(jax.nn.silu(temb))
        mod = mod.reshape(mod.shape[0], 6, -1)
        return temb, mod, self.text_embedder(text)


# ----------------------------------------------------------------------------------------------
# 3-D rotary position embedding


def rope_split(head_dim: int) -> tuple[int, int, int]:
    """Head-dim split (frame, height, width) of Wan's 3-D RoPE: h = w = 2*(K//6), f = the rest."""
    hw = 2 * (head_dim // 6)
    return head_dim - 2 * hw, hw, hw


@functools.lru_cache(maxsize=64)
def rope_angles(head_dim: int, grid: tuple[int, int, int], theta: float = 10000.0,
                max_seq_len: int = 1024) -> np.ndarray:
    """Rotation angles ``[L, K/2]`` (float64, host) for a latent grid ``(F', Y', X')``.

    Token order is frame-major (f, y, x), matching the patch flattening. Pair ``i`` of each
    axis' block rotates by ``pos * theta**(-2i/d_axis)``.
    """
    f, y, x = grid
    if max(grid) > max_seq_len:
        raise ValueError(f"latent grid {grid} exceeds rope_max_seq_len={max_seq_len}")
    parts = []
    for d, n, shape in zip(rope_split(head_dim), grid, [(f, 1, 1), (1, y, 1), (1, 1, x)]):
        inv = 1.0 / (theta ** (np.arange(0, d, 2, dtype=np.float64)[: d // 2] / d))
        ang = np.arange(n, dtype=np.float64)[:, None] * inv[None, :]
        parts.append(np.broadcast_to(ang.reshape(*shape, -1), (f, y, x, d // 2)))
    return np.concatenate(parts, axis=-1).reshape(f * y * x, head_dim // 2)


def rope_cos_sin(head_dim: int, grid, max_seq_len: int = 1024):
    """(cos, sin) as float32 device constants ``[L, K/2]``."""
    a = rope_angles(head_dim, tuple(int(g) for g in grid), 10000.0, max_seq_len)
    return jnp.asarray(np.cos(a), jnp.float32), jnp.asarray(np.sin(a), jnp.float32)


def apply_rope(x, cos, sin):
    """Rotate interleaved pairs of ``x [B, L, N, K]`` by angles ``cos/sin [L, K/2]`` (float32)."""
    xf = x.astype(jnp.float32).reshape(*x.shape[:-1], x.shape[-1] // 2, 2)
    x1, x2 = xf[..., 0], xf[..., 1]
    c = cos[None, :, None, :]
    s = sin[None, :, None, :]
    out = jnp.stack([x1 * c - x2 * s, x1 * s + x2 * c], axis=-1)
    return out.reshape(x.shape).astype(x.dtype)
