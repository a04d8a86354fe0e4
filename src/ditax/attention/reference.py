"""The oracle: plain jnp attention with a float32 softmax. Slow, simple, obviously right."""

from __future__ import annotations

import jax.numpy as jnp


def reference_attention(q, k, v, *, kv_mask=None, scale=None, return_lse: bool = False):
    """q ``[B, Lq, N, K]``, k/v ``[B, Lk, N, K]`` → ``[B, Lq, N, K]`` (and lse ``[B, N, Lq]``).

    Rows whose keys are all masked return zeros (and lse = -inf).
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = jnp.einsum("blnk,btnk->bnlt", q.astype(jnp.float32), k.astype(jnp.float32)) * scale
    if kv_mask is not None:
        s = jnp.where(kv_mask[:, None, None, :], s, -jnp.inf)
    m = jnp.max(s, axis=-1, keepdims=True)
    m_safe = jnp.where(jnp.isfinite(m), m, 0.0)
    p = jnp.exp(s - m_safe)
    denom = jnp.sum(p, axis=-1, keepdims=True)
    o = jnp.einsum("bnlt,btnk->blnk", p / jnp.where(denom == 0, 1.0, denom),
                   v.astype(jnp.float32))
    o = o.astype(q.dtype)
    if return_lse:
        lse = jnp.where(denom[..., 0] > 0, jnp.log(denom[..., 0]) + m_safe[..., 0], -jnp.inf)
        return o, lse
    return o
