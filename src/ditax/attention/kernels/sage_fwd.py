"""Pallas forward kernel of 8-bit (SageAttention-style) attention, head-major and shard-major.

Layout: that of the flash kernel (:mod:`.flash_fwd`): ``[U, B, N, L, K]``, the sequence shard
leading (what Ulysses' leading-axis ``all_to_all`` delivers and takes back); the plain
head-major call is one shard. Inputs (q / k quantized by :func:`ditax.attention.sage.prepare`,
each shard in whole blocks: the int8 copies are new arrays anyway, so padding costs no pass):

- q8 ``[U, B, N, nq·block_q, K]`` int8, k8 ``[Uk, B, N, nk·block_kv, K]`` int8 (K smoothed by
  its mean over tokens, masked keys zeroed); v ``[Uk, B, N, Lk_c, K]`` as given, in its own
  dtype (bf16 on TPU), not padded: a partial last block reads past the shard (unspecified
  rows), so the value rows of masked keys are zeroed in the kernel (``0 · NaN`` would reach
  the output) — the values of a zero-padded v, without the padded copy;
- q_rows ``[U, B, N, nq, 1, block_q]`` float32: each query's dequantization factor (its
  block's scale times the softmax scale); k_rows ``[Uk, B, N, nk, 1, block_kv]`` float32:
  each key's block scale, **0 for a masked key** (a valid key's scale is > 0), so the rows
  are the key mask too. Both travel as lane rows (:mod:`.mosaic`).

Per (query block, key block) tile: ``s = (int32(q8 · k8ᵀ) · q_row) · k_row`` — the
``s8 × s8 → s32`` product the MXU of v5e / v6e runs at twice its bf16 rate — then the float32
online softmax of the flash kernel (whose ``pallas_call`` this reuses), ``P`` cast to v's
dtype for ``P·V`` with float32 accumulation. Outputs ``o`` in v's dtype, unpadded, and the
float32 log-sum-exp rows of the *smoothed* scores.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from ditax.attention.kernels.flash_fwd import run_forward, shard_major_maps
from ditax.attention.kernels.mosaic import (
    NT,
    as_column,
    online_softmax_finish,
    online_softmax_step,
)

NEG_INF = float("-inf")


def _kernel(q_ref, k_ref, v_ref, qs_ref, ks_ref, o_ref, lse_ref, m_sc, l_sc, acc_sc, *,
            mask_v: bool):
    """One tile of the online softmax over int8 scores; grid axis 3 walks the key blocks.
    ``mask_v``: v's last block is partial (zero the rows of masked keys)."""
    j = pl.program_id(3)

    @pl.when(j == 0)
    def _init():
        m_sc[...] = jnp.full(m_sc.shape, NEG_INF, jnp.float32)
        l_sc[...] = jnp.zeros(l_sc.shape, jnp.float32)
        acc_sc[...] = jnp.zeros(acc_sc.shape, jnp.float32)

    # precision pinned (Mosaic refuses int8 operands under "highest": "Bad lhs type")
    s32 = jax.lax.dot_general(q_ref[...], k_ref[...], NT, precision=jax.lax.Precision.DEFAULT,
                              preferred_element_type=jnp.int32)
    ks = ks_ref[...]                                  # [1, bkv]; 0 = masked key
    s = s32.astype(jnp.float32) * as_column(qs_ref) * ks
    s = jnp.where(ks > 0.0, s, NEG_INF)
    v = v_ref[...]
    if mask_v:
        v = jnp.where(as_column(ks_ref) > 0.0, v, jnp.zeros_like(v))
    online_softmax_step(s, v, m_sc, l_sc, acc_sc)

    @pl.when(j == pl.num_programs(3) - 1)
    def _finish():
        online_softmax_finish(o_ref, lse_ref, m_sc, l_sc, acc_sc)


def sage_forward(q8, k8, v, q_rows, k_rows, *, out_len: int, block_q: int, block_kv: int,
                 interpret: bool):
    """Run the kernel on the shard-major layout of :mod:`.flash_fwd` (the plain head-major
    call is one shard, ``U = 1``):

    - q8 ``[U, B, N, nq·block_q, K]`` int8, k8 ``[Uk, B, N, nk·block_kv, K]`` int8 (each
      shard quantized in whole blocks); v ``[Uk, B, N, Lk_c, K]`` as given (its last block
      per shard may be partial: read past the shard, rows of masked keys zeroed);
    - q_rows ``[U, B, N, nq, 1, block_q]``, k_rows ``[Uk, B, N, nk, 1, block_kv]`` float32
      (module docstring).

    The grid walks the query blocks shard-major (shard ``i // nq``, block ``i % nq``) and the
    key blocks likewise, so with ``Lc`` a block multiple it visits the blocks of the plain
    ``[B, N, U·Lc, K]`` call in the same order: the same values, bit for bit. The output
    ``o [U, B, N, out_len, K]`` (v's dtype) is written in place, each shard's rows past
    ``out_len`` never written (no padded copy to slice); lse ``[U, B, N, nq·block_q]``."""
    U, B, N, Lq_p, K = q8.shape
    Uk, nk = k8.shape[0], k8.shape[3] // block_kv
    nq = Lq_p // block_q
    sq = pl.squeezed
    q_map, kv_map = shard_major_maps(nq, nk)
    q_spec = pl.BlockSpec((sq, sq, sq, block_q, K), q_map)
    kv_spec = pl.BlockSpec((sq, sq, sq, block_kv, K), kv_map)
    qs_spec = pl.BlockSpec((sq, sq, sq, sq, 1, block_q), lambda *g: q_map(*g) + (0,))
    ks_spec = pl.BlockSpec((sq, sq, sq, sq, 1, block_kv), lambda *g: kv_map(*g) + (0,))
    rows = (U, B, N, nq, 1, block_q)
    kernel = functools.partial(_kernel, mask_v=v.shape[3] % block_kv != 0)
    o, lse = run_forward(kernel, (B, N, U * nq, Uk * nk),
                         [q_spec, kv_spec, kv_spec, qs_spec, ks_spec], q_spec, qs_spec,
                         (q8, k8, v, q_rows, k_rows),
                         jax.ShapeDtypeStruct((U, B, N, out_len, K), v.dtype), rows, block_q,
                         K, interpret=interpret, name="ditax_sage_fwd")
    return o, lse.reshape(U, B, N, Lq_p)


__all__ = ["sage_forward"]
