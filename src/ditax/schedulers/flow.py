"""Rectified-flow arithmetic shared by the samplers and by training.

A clean sample ``x0`` and noise ``ε`` are mixed at noise level ``σ ∈ [0, 1]``:
``x_σ = (1 - σ)·x0 + σ·ε`` (:func:`add_flow_noise`); the model predicts the velocity ``ε - x0``.
Wan moves noise levels towards high noise with the shift ``σ' = s·σ / (1 + (s - 1)·σ)``
(:func:`shift_sigma`), at sampling time (``flow_shift`` / ``shift`` in the scheduler config)
and at training time (``flow.shift``). Both work on numpy and jax arrays, so the samplers can
build their schedules on the host with the very formula training uses on the device.
"""

from __future__ import annotations

import jax.numpy as jnp


def shift_sigma(sigma, shift: float):
    """Wan shift ``σ' = s·σ / (1 + (s - 1)·σ)`` of ``sigma`` (numpy or jax, any shape);
    ``shift=1`` is the identity (returned unchanged)."""
    if shift == 1.0:
        return sigma
    return shift * sigma / (1.0 + (shift - 1.0) * sigma)


def add_flow_noise(sample, noise, sigma):
    """Rectified-flow forward process ``(1 - σ)·sample + σ·noise``, in float32.

    ``sigma`` is a scalar or ``[B]`` (broadcast over the trailing axes of ``sample``); the
    result has ``sample``'s dtype.
    """
    sigma = jnp.asarray(sigma, jnp.float32)
    sigma = sigma.reshape(sigma.shape + (1,) * (sample.ndim - sigma.ndim))
    out = (1.0 - sigma) * sample.astype(jnp.float32) + sigma * noise.astype(jnp.float32)
    return out.astype(sample.dtype)


__all__ = ["add_flow_noise", "shift_sigma"]
