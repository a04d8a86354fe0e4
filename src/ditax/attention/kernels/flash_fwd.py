"""Pallas flash-attention forward kernel over the *shard-major* layout.

Layout (one layout for every caller; the plain single-device case is ``U = 1``):

- q, out ``[U, B, N, Lc, K]``: the sequence is split into ``U`` shards of ``Lc`` tokens each
  and the shard index is the **leading** axis. This is exactly what a leading-axis
  ``all_to_all`` (split/concat axis 0) produces and consumes in Ulysses: after the
  sequence→heads exchange a device holds ``[U (sequence shard), B, N/U, Lc, K]`` and the
  heads→sequence exchange sends ``out[u]`` back to shard ``u`` with no relayout copy.
  Heads sit before tokens so a block's last two dims are ``(block_q, K)`` (TPU tiling).
- k, v ``[Uk, B, N, Lk_c, K]`` likewise (``Uk = U`` in Ulysses; the plain case has
  ``U = Uk = 1`` and may have ``Lk != Lq``); the kernel walks the full key sequence across the
  ``U`` shards (shard-major, then blocks inside a shard), so for ``Lc % block_kv == 0`` the
  key blocks are visited in exactly the order of the plain ``[B, N, U*Lc, K]`` layout and
  the result is bit-identical to it.
- kv_keep ``[B, Uk, Lk_c]`` int32 (1 = attend), lse ``[U, B, N, Lc, 1]`` float32.
- optional o_prev / lse_prev (o's and lse's layout): a partial over earlier keys that the
  online softmax starts from (ring steps merge here, on ``[block_q, K]`` tiles, instead of in
  an elementwise jnp merge whose compiled form — FMA contraction — depends on the layout).

Grid ``(B, N, U * Lc/block_q)``; each program owns one query block, holds the whole key
sequence of its (batch, head) (``[U, Lc, K]``) and runs an online softmax over key blocks
in float32 (running max ``m``, denominator ``l``, accumulator ``acc``), started
empty or from (o_prev, lse_prev).

Verified here: interpret mode on CPU (tests/test_flash.py). Written for Mosaic TPU / Triton
GPU (static block shapes, ``pl.ds`` slices, float32 accumulation) but not run on them here.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

NEG_INF = float("-inf")


def _kernel(*refs, scale: float, block_kv: int, n_kv_local: int, num_shards: int,
            has_prev: bool):
    if has_prev:
        q_ref, k_ref, v_ref, keep_ref, o_prev_ref, lse_prev_ref, o_ref, lse_ref = refs
    else:
        q_ref, k_ref, v_ref, keep_ref, o_ref, lse_ref = refs
    q = q_ref[...]                                  # [bq, K]
    bq, kdim = q.shape

    def body(t, carry):
        m, l, acc = carry
        u = t // n_kv_local
        start = (t % n_kv_local) * block_kv
        k = k_ref[u, pl.ds(start, block_kv), :]     # [bkv, K]
        v = v_ref[u, pl.ds(start, block_kv), :]
        keep = keep_ref[u, pl.ds(start, block_kv)]  # [bkv]
        s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())),
                                preferred_element_type=jnp.float32) * scale
        s = jnp.where(keep[None, :] != 0, s, NEG_INF)
        m_new = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
        m_safe = jnp.where(m_new == NEG_INF, 0.0, m_new)
        p = jnp.exp(s - m_safe)
        alpha = jnp.exp(m - m_safe)
        l = alpha * l + jnp.sum(p, axis=1, keepdims=True)
        pv = jax.lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())),
                                 preferred_element_type=jnp.float32)
        return m_new, l, alpha * acc + pv

    if has_prev:
        # Continue an online softmax over earlier keys: the normalised partial o_prev with
        # log-sum-exp lse_prev is the state (m = lse_prev, l = 1, acc = o_prev); a row with
        # no earlier visible key (lse_prev = -inf) starts empty (m = -inf, l = 0, acc = 0).
        lse_prev = lse_prev_ref[...]                 # [bq, 1]
        seen = lse_prev > NEG_INF
        init = (jnp.where(seen, lse_prev, NEG_INF), jnp.where(seen, 1.0, 0.0),
                jnp.where(seen, o_prev_ref[...].astype(jnp.float32), 0.0))
    else:
        init = (jnp.full((bq, 1), NEG_INF, jnp.float32), jnp.zeros((bq, 1), jnp.float32),
                jnp.zeros((bq, kdim), jnp.float32))
    m, l, acc = jax.lax.fori_loop(0, num_shards * n_kv_local, body, init)
    empty = l == 0.0                                 # every key of this row masked
    o_ref[...] = (acc / jnp.where(empty, 1.0, l)).astype(o_ref.dtype)
    m_safe = jnp.where(m == NEG_INF, 0.0, m)
    lse_ref[...] = jnp.where(empty, NEG_INF, m_safe + jnp.log(jnp.where(empty, 1.0, l)))


def flash_forward_shard_major(q, k, v, kv_keep, o_prev=None, lse_prev=None, *, scale: float,
                              block_q: int, block_kv: int, interpret: bool):
    """Run the kernel. q ``[U, B, N, Lc, K]``, k/v ``[Uk, B, N, Lk_c, K]``,
    kv_keep ``[B, Uk, Lk_c]`` int32.

    ``o_prev`` ``[U, B, N, Lc, K]`` / ``lse_prev`` ``[U, B, N, Lc, 1]`` float32 (both or
    neither): a normalised partial result over *other* keys (an earlier ring step); the
    kernel continues its online softmax from it, so the output covers both key sets. The
    merge then happens on the kernel's own ``[block_q, K]`` tiles, whatever the layout.

    Requires ``Lc % block_q == 0`` and ``Lk_c % block_kv == 0`` (callers pad).
    Returns ``(out [U, B, N, Lc, K], lse [U, B, N, Lc, 1] float32)``; out has o_prev's dtype
    when given, else q's.
    """
    U, B, N, Lc, K = q.shape
    Uk, Lkc = k.shape[0], k.shape[3]
    if Lc % block_q or Lkc % block_kv:
        raise ValueError(f"flash kernel: shard lengths Lq_c={Lc}, Lk_c={Lkc} must be multiples "
                         f"of block_q={block_q} and block_kv={block_kv} (pad first)")
    has_prev = o_prev is not None
    if has_prev != (lse_prev is not None):
        raise ValueError("flash kernel: give o_prev and lse_prev together (or neither)")
    if has_prev and (o_prev.shape != q.shape or lse_prev.shape != (U, B, N, Lc, 1)):
        raise ValueError(f"flash kernel: o_prev{o_prev.shape} / lse_prev{lse_prev.shape} must be "
                         f"{q.shape} / {(U, B, N, Lc, 1)}")
    nq = Lc // block_q
    sq = pl.squeezed
    q_spec = pl.BlockSpec((sq, sq, sq, block_q, K), lambda b, h, i: (i // nq, b, h, i % nq, 0))
    kv_spec = pl.BlockSpec((Uk, sq, sq, Lkc, K), lambda b, h, i: (0, b, h, 0, 0))
    keep_spec = pl.BlockSpec((sq, Uk, Lkc), lambda b, h, i: (b, 0, 0))
    lse_spec = pl.BlockSpec((sq, sq, sq, block_q, 1), lambda b, h, i: (i // nq, b, h, i % nq, 0))
    kernel = functools.partial(_kernel, scale=float(scale), block_kv=block_kv,
                               n_kv_local=Lkc // block_kv, num_shards=Uk, has_prev=has_prev)
    in_specs = [q_spec, kv_spec, kv_spec, keep_spec] + ([q_spec, lse_spec] if has_prev else [])
    args = (q, k, v, kv_keep) + ((o_prev, lse_prev.astype(jnp.float32)) if has_prev else ())
    out_dtype = o_prev.dtype if has_prev else q.dtype
    return pl.pallas_call(
        kernel,
        grid=(B, N, U * nq),
        in_specs=in_specs,
        out_specs=[q_spec, lse_spec],
        out_shape=[jax.ShapeDtypeStruct(q.shape, out_dtype),
                   jax.ShapeDtypeStruct((U, B, N, Lc, 1), jnp.float32)],
        interpret=interpret,
        name="ditax_flash_fwd",
    )(*args)
