"""The blocked online-softmax pieces shared by ``blockwise`` and ``flash``: masked scores of one
key block, and the recompute-based backward.

Letters (DESIGN rule 3, attention form): B batch, L query tokens, T key tokens (text in
cross-attention, video in self-attention), N heads, K head dim; layout BSHD ``[B, L, N, K]``.

Backward, given the forward's ``lse`` and ``delta = rowsum(dO ∘ O) − dlse`` (the lse
cotangent enters with the opposite sign), one key block ``j`` at a time (``lax.scan``):
``P = exp(S_j − lse)``, ``dV_j = Pᵀ·dO``, ``dP = dO·V_jᵀ``, ``dS = P ∘ (dP − delta)·scale``,
``dQ += dS·K_j``, ``dK_j = dSᵀ·Q``. Scores are recomputed, never stored: memory stays
``O(L · block)`` per (batch, head) in both directions.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax


def to_blocks(x, block: int):
    """``[B, T, ...]`` → ``[T/block, B, block, ...]`` (scan axis first)."""
    B, T = x.shape[:2]
    return jnp.moveaxis(x.reshape(B, T // block, block, *x.shape[2:]), 1, 0)


def from_blocks(x):
    """Inverse of :func:`to_blocks`."""
    nb, B, bk = x.shape[:3]
    return jnp.moveaxis(x, 0, 1).reshape(B, nb * bk, *x.shape[3:])


def scores(q, k_j, m_j, scale, precision=None):
    """float32 scores ``[B, N, L, bk]`` of q ``[B, L, N, K]`` against one key block
    ``[B, bk, N, K]``; masked keys (``m_j [B, bk]`` False) at -inf.

    The mask enters as an additive ``[B, 1, 1, bk]`` bias, not a select on a broadcast
    predicate: under autodiff of an enclosing ``scan`` (the transformer's layer scan) JAX
    otherwise stacked the broadcast predicate for every K/V block as a residual
    (``[blocks, B, N, L, bk]`` bools — hundreds of GiB at Wan 720p).
    """
    s = jnp.einsum("blnk,btnk->bnlt", q, k_j, preferred_element_type=jnp.float32,
                   precision=precision) * scale
    bias = jnp.where(m_j, 0.0, -jnp.inf).astype(jnp.float32)
    return s + bias[:, None, None, :]


def softmax_delta(do, o, dlse):
    """``rowsum(dO ∘ O) − dlse`` ``[B, N, L]`` float32 (dO, O ``[B, L, N, K]``)."""
    delta = jnp.einsum("blnk,blnk->bnl", do.astype(jnp.float32), o.astype(jnp.float32))
    return delta - dlse.astype(jnp.float32)


def recompute_backward(q, k, v, mask, lse, delta, do, *, scale: float, block_kv: int,
                       precision=None):
    """Cotangents of q ``[B, L, N, K]`` and k/v ``[B, T, N, K]`` (float32, same layouts).

    ``mask [B, T]`` bool (T a multiple of ``block_kv``), ``lse [B, N, L]`` of the forward
    (-inf for rows without a visible key: their P is 0), ``delta`` from
    :func:`softmax_delta`, ``do`` the output cotangent. Matmuls take their inputs in the
    dtypes given and accumulate in float32.
    """
    lse_safe = jnp.where(jnp.isfinite(lse), lse, jnp.inf)   # empty rows: p = exp(-inf) = 0
    do_c = do.astype(v.dtype)

    def step(dq, blk):
        k_j, v_j, m_j = blk
        s = scores(q, k_j, m_j, scale, precision)
        p = jnp.exp(s - lse_safe[..., None])                           # [B, N, L, bk]
        dv_j = jnp.einsum("bnlt,blnk->btnk", p.astype(do_c.dtype), do_c,
                          preferred_element_type=jnp.float32, precision=precision)
        dp = jnp.einsum("blnk,btnk->bnlt", do_c, v_j, preferred_element_type=jnp.float32,
                        precision=precision)
        ds = (p * (dp - delta[..., None])) * scale
        dq = dq + jnp.einsum("bnlt,btnk->blnk", ds.astype(k_j.dtype), k_j,
                             preferred_element_type=jnp.float32, precision=precision)
        dk_j = jnp.einsum("bnlt,blnk->btnk", ds.astype(q.dtype), q,
                          preferred_element_type=jnp.float32, precision=precision)
        return dq, (dk_j, dv_j)

    blocks = (to_blocks(k, block_kv), to_blocks(v, block_kv), to_blocks(mask, block_kv))
    dq, (dk, dv) = lax.scan(step, jnp.zeros(q.shape, jnp.float32), blocks)
    return dq, from_blocks(dk), from_blocks(dv)


__all__ = ["to_blocks", "from_blocks", "scores", "softmax_delta", "recompute_backward"]
