"""Random attention inputs and the tolerances the attention tests share."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

F32_TOL, GRAD_TOL, BF16_TOL = 2e-5, 5e-5, 2e-2


def make_inputs(rng, B, Lq, Lk, N, K, masked, dtype=jnp.float32):
    q = jnp.asarray(rng.standard_normal((B, Lq, N, K)), dtype)
    k = jnp.asarray(rng.standard_normal((B, Lk, N, K)), dtype)
    v = jnp.asarray(rng.standard_normal((B, Lk, N, K)), dtype)
    mask = None
    if masked:  # different valid lengths per row; the last row attends to every key
        lens = rng.integers(1, Lk, size=B)
        lens[-1] = Lk
        mask = jnp.asarray(np.arange(Lk)[None, :] < lens[:, None])
    return q, k, v, mask


def rel_err(x, ref):
    x, ref = np.asarray(x, np.float32), np.asarray(ref, np.float32)
    return float(np.max(np.abs(x - ref)) / max(np.max(np.abs(ref)), 1e-30))


def o_lse_loss(fn, mask):
    """A scalar touching both of ``fn``'s outputs (``o`` and the finite part of ``lse``:
    ``fn(q, k, v, kv_mask=, return_lse=True)``), with ``(o, lse)`` as aux: one
    ``value_and_grad`` checks the values and the gradients of both."""
    def loss(q, k, v):
        o, lse = fn(q, k, v, kv_mask=mask, return_lse=True)
        w = jnp.cos(jnp.arange(o.size, dtype=jnp.float32)).reshape(o.shape)
        return jnp.sum(o * w) + 0.3 * jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0)), (o, lse)
    return loss
