"""Timestep and text embedders of diffusion transformers (diffusers ``Timesteps``,
``TimestepEmbedding``, ``PixArtAlphaTextProjection``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ditax.nn.linear import Linear


def sinusoid_frequencies(dim: int, max_period: float = 10000.0) -> np.ndarray:
    """The ``dim/2`` frequencies of the timestep sinusoid (float32, host): diffusers' float32
    exponents ``-ln(max_period) · i / (dim/2)``, each exponentiated in float64 and rounded
    once, so the same correctly rounded table on every platform. Timesteps enter ×1000, so
    one ulp of a frequency moves an angle by up to 1e-4 rad: jnp's float32 ``exp`` differs
    from torch's in ~17 of 128 entries (the rounded float64 one in ~2), and a TPU's ``exp``
    and division are less exact still. Computed on device, the table was what a platform's
    arithmetic moved the tiny Wan's float32 training step by: errors of 16 ulps in its
    ``exp`` and division alone move the CPU's step (its update 2.8e-4, a zero-initialised
    bias 4.3e-4 of its step) as far as the v5e's differed from the CPU's, where with the
    table a constant the same errors in every ``exp``, division, ``tanh``, ``rsqrt``… leave
    its gradient 5.7e-6 from the float64 truth (the CPU's: 5.0e-6; tests/refs/step_truth.py,
    tests/tpu/test_chip_steps.py)."""
    half = dim // 2
    exponent = np.float32(-np.log(max_period)) * np.arange(half, dtype=np.float32)
    exponent = exponent / np.float32(half)
    return np.exp(exponent.astype(np.float64)).astype(np.float32)


def timestep_embedding(t, dim: int, max_period: float = 10000.0):
    """Sinusoidal embedding ``[B] → [B, dim]`` float32, cos half first (diffusers'
    ``Timesteps(flip_sin_to_cos=True, downscale_freq_shift=0)``), the frequencies a host
    constant (:func:`sinusoid_frequencies`)."""
    freqs = jnp.asarray(sinusoid_frequencies(dim, max_period))
    args = jnp.asarray(t, jnp.float32)[:, None] * freqs[None, :]
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
