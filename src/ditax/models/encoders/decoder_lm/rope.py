"""Rotary embedding of the decoder LMs: transformers' "rotate half" layout (channel ``i``
pairs with ``i + K/2``), one table per layer kind.

The tables are built on the host the way transformers builds them in float32 —
``inv_freq = 1 / theta**(2i/K)`` (``/ factor`` for ``linear`` scaling), angles ``pos ·
inv_freq`` rounded to float32, ``cos`` / ``sin`` of those — except that ``theta**(2i/K)`` is
computed in float64 and rounded once (torch's float32 ``pow`` is off by one ulp on some
frequencies). The two tables therefore agree to the float32 rounding of ``inv_freq``: exactly
at short range, ~1e-4 absolute in a few channels at position 2048.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ditax.models.encoders.decoder_lm.config import Rope


def inverse_frequencies(rope: Rope, head_dim: int) -> np.ndarray:
    """``inv_freq`` float32 ``[K/2]`` of ``rope`` for heads of ``head_dim`` channels."""
    exps = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    inv = np.float32(1.0) / (float(rope.theta) ** exps.astype(np.float64)).astype(np.float32)
    if rope.kind == "linear":
        inv = inv / np.float32(rope.factor)
    return inv.astype(np.float32)


def rotate_half_tables(rope: Rope, head_dim: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """``(cos, sin)`` float32 ``[T, K]`` for positions ``0 .. T-1`` (each frequency on
    channels ``i`` and ``i + K/2``), as :func:`apply_rotate_half` takes them."""
    angles = np.arange(length, dtype=np.float32)[:, None] * inverse_frequencies(rope, head_dim)
    angles = np.concatenate([angles, angles], axis=-1).astype(np.float64)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def apply_rotate_half(x, cos, sin):
    """``x·cos + rotate_half(x)·sin`` on ``x [B, T, N, K]`` with tables ``[T, K]`` already in
    ``x``'s dtype (as transformers rounds them), where ``rotate_half(x) = [-x₂, x₁]`` of the
    two halves of K."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[None, :, None, :] + rotated * sin[None, :, None, :]


__all__ = ["inverse_frequencies", "rotate_half_tables", "apply_rotate_half"]
