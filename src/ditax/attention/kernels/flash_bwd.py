"""Pallas flash-attention backward kernels over the *shard-major* layout (FlashAttention-2).

Same layouts as the forward kernel (:mod:`ditax.attention.kernels.flash_fwd`):
q, o, dO ``[U, B, N, Lc, K]``; k, v ``[Uk, B, N, Lk_c, K]``; kv_keep ``[B, Uk, Lk_c]`` int32
(1 = attend); lse, dlse ``[U, B, N, Lc, 1]`` float32. Keys are walked shard-major (shard
``j // cdiv(Lk_c, bkv)``, block inside it), queries likewise, so gradients land in the layout
the Ulysses exchange sends back with no relayout. Shards need not be block multiples (their
last blocks partial, as in the forward).

With ``P = exp(S - lse)`` recomputed per tile and ``delta = sum(dO * o) - dlse`` (``dlse`` is
the cotangent of the returned log-sum-exp, which a ring merge differentiates through):

- **dq kernel**, grid ``(B, N, U·cdiv(Lc, bq), Uk·cdiv(Lk_c, bkv))``, keys innermost and
  sequential: delta of the query block on its ``[bq, K]`` tiles at the first key block (so it
  rounds the same in every layout; written out for the other kernel), then
  ``dS = P * (dO vᵀ - delta)``, ``dq += dS k`` in a ``[bq, K]`` float32 VMEM accumulator.
- **dk/dv kernel**, grid ``(B, N, Uk·cdiv(Lk_c, bkv), U·cdiv(Lc, bq))``, queries innermost and
  sequential, computed transposed (``Sᵀ = k qᵀ``, ``[bkv, bq]``) so every matmul is a plain or
  ``A Bᵀ`` MXU product (no transposed-LHS operand): ``dv += Pᵀ dO``, ``dk += dSᵀ q`` in
  ``[bkv, K]`` float32 accumulators.

MXU operands stay in the input dtype (bf16 in, P and dS cast to it) with float32 accumulation
and a pinned precision (:func:`~ditax.attention.kernels.mosaic.mxu_dot`). Rows whose keys are
all masked (lse = -inf) get ``P = 0`` and contribute nothing. Per-row vectors (lse, delta, the
key mask) enter as lane rows ``[..., n, 1, b]`` (see :mod:`ditax.attention.kernels.mosaic`:
they lower for every block that is a multiple of 8 and are compact in HBM).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from ditax.attention.kernels.flash_fwd import (Tune, by_mask, compiler_params, mask_kind,
                                               pad_rows, sparse_lists)
from ditax.attention.kernels.flash_sparse import live, pallas_call, when
from ditax.attention.kernels.mosaic import LOG2E, NN, NT, as_column, mxu_dot
from ditax.intmath import ceil_div

NEG_INF = float("-inf")


def _dq_kernel(*refs, scale: float, mask_kv: bool = False, mask: str = "all", nkv: int = 1,
               q_len: int | None = None, nq: int = 1, sparse: bool = False, width: int = 1):
    """One (query block, key block) tile; grid axis 3 walks the keys, dq accumulates.
    ``refs``: the inputs ``q, k, v, keep, dO, lse, dlse, o``, the outputs ``dq, delta`` and
    the scratch ``acc, delta`` (pallas_call's order).

    At the first key block the block's softmax delta ``rowsum(dO · o) - dlse`` is computed
    (float32, on the ``[block_q, K]`` tiles: the same arithmetic whatever layout or padding
    the caller has) and written out for the dk/dv kernel. ``mask_kv``: zero the key and
    value rows of masked keys (a partial last key block reads past the shard: unspecified
    rows, and ``0 * NaN`` in ``dS k`` or ``dO vᵀ`` would reach valid rows). ``q_len``: the
    shard length when it is no multiple of the query block; delta is 0 past it.
    ``sparse``: the block lists lead ``refs``; only listed live key blocks are computed
    (:mod:`.flash_sparse`)."""
    refs, kv_block, alive = live(refs, sparse, width)
    (q_ref, k_ref, v_ref, keep_ref, do_ref, lse_ref, dlse_ref, o_ref, dq_ref, delta_ref,
     acc_sc, delta_sc) = refs
    i, j = pl.program_id(2), pl.program_id(3)   # (read outside pl.when: interpret mode)

    @pl.when(j == 0)
    def _init():
        acc_sc[...] = jnp.zeros(acc_sc.shape, jnp.float32)
        f32 = jnp.float32
        d = jnp.sum(do_ref[...].astype(f32) * o_ref[...].astype(f32), axis=1, keepdims=True)
        d = d - as_column(dlse_ref)
        if q_len is not None:
            d = jnp.where(_rows(i, nq, d.shape[0]) < q_len, d, 0.0)
        delta_sc[...] = d

    q, do = q_ref[...], do_ref[...]                                 # [bq, K]
    lse = as_column(lse_ref)                                        # [bq, 1]
    lse2 = jnp.where(lse == NEG_INF, jnp.inf, lse) * LOG2E          # empty row: P = 0
    c = scale * LOG2E

    def tile(masked: bool):
        k, v = k_ref[...], v_ref[...]                               # [bkv, K]
        if masked and mask_kv:
            kept = as_column(keep_ref) != 0
            k, v = jnp.where(kept, k, jnp.zeros_like(k)), jnp.where(kept, v, jnp.zeros_like(v))
        s = mxu_dot(q, k, NT)                                       # unscaled [bq, bkv]
        if masked:
            s = jnp.where(keep_ref[...] != 0, s, NEG_INF)           # keep [1, bkv]
        p = jnp.exp2(s * c - lse2)                                  # exp(s·scale - lse)
        dp = mxu_dot(do, v, NT)
        ds = p * (dp - delta_sc[...])
        acc_sc[...] += mxu_dot(ds.astype(k.dtype), k, NN)

    when(alive, lambda: by_mask(tile, mask, kv_block, nkv))

    @pl.when(j == pl.num_programs(3) - 1)
    def _finish():
        dq_ref[...] = (acc_sc[...] * scale).astype(dq_ref.dtype)
        delta_ref[...] = delta_sc[...].T                            # [bq, 1] -> lane row


def _rows(i, nq: int, block: int):
    """Row indices inside its shard of query block ``i`` (grid index over ``U·nq``), as a
    ``[block, 1]`` column."""
    return jax.lax.rem(i, nq) * block + jax.lax.broadcasted_iota(jnp.int32, (block, 1), 0)


def _dkv_kernel(*refs, scale: float, mask: str = "all", nkv: int = 1,
                q_len: int | None = None, nq: int = 1, sparse: bool = False, width: int = 1):
    """One (key block, query block) tile, transposed; grid axis 3 walks the queries.
    ``q_len``: the shard length when it is no multiple of the query block — the query and
    dO rows of a partial last block past it are zeroed (unspecified values read past the
    shard; their lse is +inf and their delta 0, so they add exact zeros). ``sparse``: the
    block lists (key block -> its live query blocks) lead ``refs``."""
    refs, q_block, alive = live(refs, sparse, width)
    (q_ref, k_ref, v_ref, keep_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref,
     dk_sc, dv_sc) = refs
    i = pl.program_id(3)

    @pl.when(i == 0)
    def _init():
        dk_sc[...] = jnp.zeros(dk_sc.shape, jnp.float32)
        dv_sc[...] = jnp.zeros(dv_sc.shape, jnp.float32)

    q, k, v, do = q_ref[...], k_ref[...], v_ref[...], do_ref[...]
    if q_len is not None:
        valid = _rows(q_block, nq, q.shape[0]) < q_len
        q = jnp.where(valid, q, jnp.zeros_like(q))
        do = jnp.where(valid, do, jnp.zeros_like(do))
    lse = lse_ref[...]                                              # [1, bq]
    lse2 = jnp.where(lse == NEG_INF, jnp.inf, lse) * LOG2E          # empty row: P = 0
    c = scale * LOG2E

    def tile(masked: bool):
        st = mxu_dot(k, q, NT)                                      # unscaled [bkv, bq]
        if masked:
            st = jnp.where(as_column(keep_ref) != 0, st, NEG_INF)   # keep [bkv, 1]
        pt = jnp.exp2(st * c - lse2)                                # exp(sᵀ·scale - lse)
        dv_sc[...] += mxu_dot(pt.astype(do.dtype), do, NN)
        dpt = mxu_dot(v, do, NT)
        dst = pt * (dpt - delta_ref[...])                           # delta [1, bq]
        dk_sc[...] += mxu_dot(dst.astype(q.dtype), q, NN)

    when(alive, lambda: by_mask(tile, mask, pl.program_id(2), nkv))

    @pl.when(i == pl.num_programs(3) - 1)
    def _finish():
        dk_ref[...] = (dk_sc[...] * scale).astype(dk_ref.dtype)
        dv_ref[...] = dv_sc[...].astype(dv_ref.dtype)


def _cost(*, q, k, n_q, n_kv, matmuls, resident_q):
    """What XLA's cost analysis should count for one kernel (it sees a custom call otherwise):
    ``matmuls`` products of ``2 B N Lq Lk K`` flops, one exp per score, and HBM traffic — the
    resident side (q, dO and o for dq; k and v for dk/dv) read and its gradient written
    once, the streamed side read once per resident block."""
    U, B, N, Lc, K = q.shape
    Lq, Lk = U * Lc, k.shape[0] * k.shape[3]
    q_bytes, k_bytes = q.size * q.dtype.itemsize, k.size * k.dtype.itemsize
    if resident_q:
        traffic = 4 * q_bytes + n_q * 2 * k_bytes
    else:
        traffic = 4 * k_bytes + n_kv * 2 * q_bytes
    return pl.CostEstimate(flops=matmuls * 2 * B * N * Lq * Lk * K,
                           transcendentals=B * N * Lq * Lk, bytes_accessed=int(traffic))


def flash_backward_shard_major(q, k, v, kv_keep, o, lse, do, dlse, *, scale: float,
                               block_q: int, block_kv: int, interpret: bool,
                               tune: Tune = Tune()):
    """Gradients of the flash forward w.r.t. q, k, v (two Pallas kernels).

    Args: the forward's inputs and outputs in its layouts (module docstring) plus the
    cotangents ``do`` ``[U, B, N, Lc, K]`` and ``dlse`` ``[U, B, N, Lc, 1]``. ``lse`` is the
    *final* one (after any ``o_prev`` continuation); the ``o_prev``/``lse_prev`` terms are in
    :func:`prev_cotangents`. Shards need not be block multiples (partial last blocks, as in
    the forward: the rows past a shard read unspecified values and are masked or zeroed,
    never written). Returns ``(dq, dk, dv, delta)``: gradients in the dtypes and layouts of
    q, k, v, and the softmax delta ``[U, B, N, Lc, 1]`` float32 the dq kernel computed.
    """
    U, B, N, Lc, K = q.shape
    Uk, Lkc = k.shape[0], k.shape[3]
    nq, nkv = ceil_div(Lc, block_q), ceil_div(Lkc, block_kv)
    lists = sparse_lists(tune, U, Uk, Lc, Lkc, block_q, block_kv)
    lists_t = sparse_lists(tune, U, Uk, Lkc, Lc, block_kv, block_q, transpose=True)
    # Per-row vectors as lane rows: lse/dlse/delta [U, B, N, nq, 1, bq], mask
    # [B, Uk*nkv, 1, bkv] (free reshapes; compact (1, 128)-tiled in HBM, where a [.., L, 1]
    # column is padded to 128 lanes). Kernels turn a row into a column where they need one.
    # Rows past a shard (a partial last block): lse +inf and delta 0, so P = 0 there.
    rows = (U, B, N, nq, 1, block_q)
    lse_row = pad_rows(lse.astype(jnp.float32)[..., 0], nq * block_q, float("inf"))
    dlse_row = pad_rows(dlse.astype(jnp.float32)[..., 0], nq * block_q, 0.0)
    keep_row = pad_rows(kv_keep.astype(jnp.int32), nkv * block_kv, 0)
    keep_row = keep_row.reshape(B, Uk * nkv, 1, block_kv)
    lse_row, dlse_row = lse_row.reshape(rows), dlse_row.reshape(rows)
    partial_q = dict(nq=nq, q_len=Lc if Lc % block_q else None)

    sq = pl.squeezed
    div, rem = jax.lax.div, jax.lax.rem   # (no floor-division sign fix-ups in index maps)
    from jax.experimental.pallas import tpu as pltpu

    def q_at(b, h, i):
        return div(i, nq), b, h, rem(i, nq), 0

    def kv_at(b, h, j):
        return div(j, nkv), b, h, rem(j, nkv), 0

    q_blk, kv_blk = (sq, sq, sq, block_q, K), (sq, sq, sq, block_kv, K)
    row_blk, keep_blk = (sq, sq, sq, sq, 1, block_q), (sq, sq, 1, block_kv)
    params = compiler_params(tune)
    mask = dict(mask=mask_kind(tune.masked, Lkc % block_kv != 0), nkv=nkv)
    cost = functools.partial(_cost, q=q, k=k, n_q=U * nq, n_kv=Uk * nkv)

    # dq: grid (b, h, i = query block, j = key block)
    q_spec = pl.BlockSpec(q_blk, lambda b, h, i, j: q_at(b, h, i))
    kv_spec = pl.BlockSpec(kv_blk, lambda b, h, i, j: kv_at(b, h, j))
    row_spec = pl.BlockSpec(row_blk, lambda b, h, i, j: q_at(b, h, i) + (0,))
    keep_spec = pl.BlockSpec(keep_blk, lambda b, h, i, j: (b, j, 0, 0))
    dq, delta_row = pallas_call(
        functools.partial(_dq_kernel, scale=float(scale), mask_kv=Lkc % block_kv != 0,
                          **mask, **partial_q, **_sparse(lists)),
        lists=lists,
        grid=(B, N, U * nq, Uk * nkv),
        in_specs=[q_spec, kv_spec, kv_spec, keep_spec, q_spec, row_spec, row_spec, q_spec],
        out_specs=[q_spec, row_spec],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                   jax.ShapeDtypeStruct(rows, jnp.float32)],
        scratch_shapes=[pltpu.VMEM((block_q, K), jnp.float32),
                        pltpu.VMEM((block_q, 1), jnp.float32)],
        compiler_params=params,
        interpret=interpret,
        name="ditax_flash_bwd_dq",
        cost_estimate=cost(matmuls=3, resident_q=True),
    )(q, k, v, keep_row, do, lse_row, dlse_row, o)

    # dk/dv: grid (b, h, j = key block, i = query block)
    q_spec = pl.BlockSpec(q_blk, lambda b, h, j, i: q_at(b, h, i))
    kv_spec = pl.BlockSpec(kv_blk, lambda b, h, j, i: kv_at(b, h, j))
    row_spec = pl.BlockSpec(row_blk, lambda b, h, j, i: q_at(b, h, i) + (0,))
    keep_spec = pl.BlockSpec(keep_blk, lambda b, h, j, i: (b, j, 0, 0))
    dk, dv = pallas_call(
        functools.partial(_dkv_kernel, scale=float(scale), **mask, **partial_q,
                          **_sparse(lists_t)),
        lists=lists_t,
        grid=(B, N, Uk * nkv, U * nq),
        in_specs=[q_spec, kv_spec, kv_spec, keep_spec, q_spec, row_spec, row_spec],
        out_specs=[kv_spec, kv_spec],
        out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype),
                   jax.ShapeDtypeStruct(v.shape, v.dtype)],
        scratch_shapes=[pltpu.VMEM((block_kv, K), jnp.float32),
                        pltpu.VMEM((block_kv, K), jnp.float32)],
        compiler_params=params,
        interpret=interpret,
        name="ditax_flash_bwd_dkv",
        cost_estimate=cost(matmuls=4, resident_q=False),
    )(q, k, v, keep_row, do, lse_row, delta_row)
    return dq, dk, dv, delta_row.reshape(U, B, N, nq * block_q)[..., :Lc, None]


def _sparse(lists) -> dict:
    """A kernel's ``sparse`` / ``width`` arguments for ``lists`` (None: dense)."""
    return dict(sparse=lists is not None, width=lists[2] if lists else 1)


def prev_cotangents(o_prev, lse_prev, lse, do, delta):
    """Cotangents of a continued partial: ``o = w o_prev + sum_j P_j v_j`` with
    ``w = exp(lse_prev - lse)``, so ``d o_prev = w dO`` and
    ``d lse_prev = w (dO . o_prev - delta)``. Elementwise, in jnp; shapes as o / lse.
    Returns ``(d_o_prev, d_lse_prev)`` in the dtypes of o_prev / lse_prev.
    """
    f32 = jnp.float32
    lse_safe = jnp.where(jnp.isfinite(lse), lse, jnp.inf)
    w = jnp.where(jnp.isfinite(lse_prev), jnp.exp(lse_prev.astype(f32) - lse_safe), 0.0)
    d_o_prev = w * do.astype(f32)
    d_lse_prev = w * (jnp.sum(do.astype(f32) * o_prev.astype(f32), axis=-1, keepdims=True)
                      - delta)
    return d_o_prev.astype(o_prev.dtype), d_lse_prev.astype(lse_prev.dtype)


def flash_core_bwd(scale, block_q, block_kv, interpret, tune, res, cts):
    """Drop-in for ``flash._core_bwd`` (same arguments, same residuals and return tuple; the
    tiles ``tune``'s backward blocks, which divide the forward's, else the forward's):
    ``(dq, dk, dv, None[keep], d_o_prev, d_lse_prev)``, the last two None without o_prev."""
    q, k, v, keep, o_prev, lse_prev, o, lse = res
    do, dlse = cts
    dq, dk, dv, delta = flash_backward_shard_major(
        q, k, v, keep, o, lse, do, dlse, scale=scale, block_q=tune.block_q_bwd or block_q,
        block_kv=tune.block_kv_bwd or block_kv, interpret=interpret, tune=tune)
    d_prev = (None, None)
    if o_prev is not None:
        d_prev = prev_cotangents(o_prev, lse_prev, lse.astype(jnp.float32), do, delta)
    return (dq, dk, dv, None) + d_prev
