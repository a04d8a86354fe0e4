"""``jax.nn.dot_product_attention`` with the XLA implementation."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def xla_attention(q, k, v, *, kv_mask=None, scale=None):
    """q ``[B, Lq, N, K]``, k/v ``[B, Lk, N, K]`` → ``[B, Lq, N, K]`` via XLA's fused path.

    The mask, when given, is broadcast to ``[B, 1, 1, Lk]``. Rows with every key masked are
    zero (as the reference), not NaN.
    """
    mask = None if kv_mask is None else kv_mask[:, None, None, :]
    o = jax.nn.dot_product_attention(q, k, v, mask=mask, scale=scale, implementation="xla")
    if kv_mask is not None:
        any_key = jnp.any(kv_mask, axis=1)[:, None, None, None]
        o = jnp.where(any_key, o, jnp.zeros_like(o))
    return o
