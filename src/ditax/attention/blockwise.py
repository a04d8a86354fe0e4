"""Flash-style attention in plain JAX: a ``lax.scan`` over K/V blocks with an online softmax.

Why: it runs on every platform, never materialises the ``[Lq, Lk]`` score matrix, and its
custom VJP recomputes scores block by block, so forward *and* backward hold
``O(Lq · block_kv)`` scores instead of ``O(Lq · Lk)``. It is also the local kernel the ring
backend can reuse, since it can return the log-sum-exp of every query row.

Algorithm (per K/V block j, all in float32):
  ``s = q·k_jᵀ·scale`` (masked keys → -inf), ``m' = max(m, rowmax s)``,
  ``acc = acc·e^(m-m') + e^(s-m')·v_j``, ``l = l·e^(m-m') + rowsum e^(s-m')``;
  at the end ``o = acc / l`` and ``lse = m + log l``.
Backward: :func:`ditax.attention.recompute.recompute_backward` (shared with ``flash``),
from the saved ``lse`` — scores recomputed one key block at a time.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from ditax.attention.options import BlockwiseOptions
from ditax.attention.recompute import (
    recompute_backward,
    scores,
    softmax_delta,
    to_blocks,
)


def blockwise_attention(q, k, v, *, kv_mask=None, scale=None,
                        block_kv: int = BlockwiseOptions.block_kv, return_lse: bool = False):
    """q ``[B, Lq, N, K]``, k/v ``[B, Lk, N, K]``, kv_mask ``[B, Lk]`` → ``[B, Lq, N, K]``.

    Args:
      block_kv: keys per scan step; Lk is padded to a multiple of it (padded keys masked).
      return_lse: also return the float32 log-sum-exp ``[B, N, Lq]`` (-inf for rows whose
        keys are all masked; those rows' outputs are zero). Differentiable w.r.t. both.
    """
    if not isinstance(block_kv, int) or block_kv < 1:
        raise ValueError(f"block_kv={block_kv!r} must be a positive int (e.g. 512)")
    scale = float(q.shape[-1] ** -0.5 if scale is None else scale)
    B, Lk = k.shape[0], k.shape[1]
    bk = min(block_kv, Lk)
    pad = (-Lk) % bk
    mask = jnp.ones((B, Lk), bool) if kv_mask is None else kv_mask.astype(bool)
    if pad:
        k = jnp.pad(k, ((0, 0), (0, pad), (0, 0), (0, 0)))
        v = jnp.pad(v, ((0, 0), (0, pad), (0, 0), (0, 0)))
        mask = jnp.pad(mask, ((0, 0), (0, pad)))  # pads with False: never attended
    out, lse = _core(q, k, v, mask, scale, bk)
    return (out, lse) if return_lse else out


def _forward(q, k, v, mask, scale, bk):
    B, Lq, N, K = q.shape
    init = (jnp.full((B, N, Lq), -jnp.inf, jnp.float32),   # running max m
            jnp.zeros((B, N, Lq), jnp.float32),             # running denominator l
            jnp.zeros((B, N, Lq, K), jnp.float32))          # running numerator acc

    def step(carry, blk):
        m, l, acc = carry
        k_j, v_j, m_j = blk
        s = scores(q, k_j, m_j, scale)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)  # all-masked so far: no shift
        alpha = jnp.exp(m - m_safe)                            # exp(-inf) = 0 on first block
        p = jnp.exp(s - m_safe[..., None])
        l = l * alpha + jnp.sum(p, axis=-1)
        acc = acc * alpha[..., None] + jnp.einsum(
            "bnlt,btnk->bnlk", p.astype(v_j.dtype), v_j, preferred_element_type=jnp.float32)
        return (m_new, l, acc), None

    blocks = (to_blocks(k, bk), to_blocks(v, bk), to_blocks(mask, bk))
    (m, l, acc), _ = lax.scan(step, init, blocks)
    nonempty = l > 0
    o = acc / jnp.where(nonempty, l, 1.0)[..., None]
    lse = jnp.where(nonempty, m + jnp.log(jnp.where(nonempty, l, 1.0)), -jnp.inf)
    return jnp.swapaxes(o, 1, 2).astype(q.dtype), lse  # [B, Lq, N, K], [B, N, Lq]


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _core(q, k, v, mask, scale, bk):
    return _forward(q, k, v, mask, scale, bk)


def _core_fwd(q, k, v, mask, scale, bk):
    o, lse = _forward(q, k, v, mask, scale, bk)
    return (o, lse), (q, k, v, mask, o, lse)


def _core_bwd(scale, bk, res, cts):
    q, k, v, mask, o, lse = res
    do, dlse = cts
    delta = softmax_delta(do, o, dlse)
    dq, dk, dv = recompute_backward(q, k, v, mask, lse, delta, do, scale=scale, block_kv=bk)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None


_core.defvjp(_core_fwd, _core_bwd)
