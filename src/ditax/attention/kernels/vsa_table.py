"""Pallas TPU kernels of VSA's fine pass read from a per-(sample, head, query tile) table of
picked key tiles (``attention.sparsity=vsa attention.vsa_fine=table``;
:mod:`ditax.attention.sparse.vsa_table` is the differentiable wrapper).

Layout: q, k, v, o ``[B, N, L, K]`` head-major, or ``[B, L, N·K]`` packed where ``K`` is a
multiple of 128 (a head is a column block: the projections' layout, no transposes), ``L = T ·
t`` (``T`` tiles of ``t`` tokens, tile-major order); one kernel block is one whole tile
``(t, K)``. Per-row vectors (lse, the
softmax delta, the key mask) travel as lane rows ``[B, N, T, 1, t]`` / ``[B, T, 1, t]``
(:mod:`.mosaic`).

- **forward**, grid ``(B, N, T, topk)``: ``picks [B, N, T, topk]`` int32, flattened, is the
  scalar-prefetched operand (SMEM); the K / V (and key mask) index maps read the key tile of
  position ``(b, h, i, j)`` from it, so each query tile's ``topk`` key tiles are DMA'd from
  K / V where they lie: no gathered copy. The online softmax runs in VMEM scratch (float32),
  the output (float32) and the log-sum-exp row are written at the last position.
- **dq**, the same grid and table: the softmax delta ``rowsum(dO · o)`` at the first position,
  then ``dq += (P ∘ (dO vᵀ - delta)) k`` (FlashAttention-2).
- **dk / dv**, grid ``(B, N, P)``, ``P = T · (topk + 1)`` (``Tq · topk + T`` for a call
  over ``Tq`` of the ``T`` query tiles: its dk / dv are that call's share): the transposed
  table (:func:`inverse_table`, built with jnp on the device: no host round trip) lists,
  for each key tile in order, the query tiles that picked it; a key tile's run of positions is
  consecutive, so its ``dk`` / ``dv`` output blocks stay resident across the run and are
  written once at its end. A key tile no query tile picked gets one dead position (its
  gradients zero); the spare positions at the end repeat the last entry, dead (no new DMA).
  Each entry packs ``key tile | query tile << 14 | live << 28 | first << 29 | last << 30``
  in one int32, so the table is one SMEM operand of ``B · N · P`` words.

SMEM holds about 1 MiB (TPU v4 … v6e); :data:`SMEM_WORDS` is the budget a caller splits its
heads to (the wrapper does). Verified here: interpret mode on CPU against the jnp VSA and the
dense reference, and lowering to Mosaic TPU (``jax.export``); not yet run on a chip.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from ditax.attention.kernels.mosaic import (LOG2E, NN, NT, as_column, mxu_dot,
                                            online_softmax_finish, online_softmax_start,
                                            online_softmax_step)

NEG_INF = float("-inf")
F32 = jnp.float32
#: int32 words of scalar-prefetched table one call may take (half of a 1 MiB SMEM)
SMEM_WORDS = 128 * 1024
#: tiles the packed dk/dv table can name (14 bits a tile id)
MAX_TILES = 1 << 14


def _dims(q, heads: int):
    """``(B, N, L, K, packed)`` of ``q``: ``[B, N, L, K]`` head-major, or ``[B, L, N·K]``
    packed (``N = heads``; a head is a column block of ``K``: a multiple of 128 lanes)."""
    if q.ndim == 4:
        B, N, L, K = q.shape
        return B, N, L, K, False
    B, L, NK = q.shape
    return B, heads, L, NK // heads, True


def _spec(t: int, K: int, index_map, packed: bool = False):
    """The ``(t, K)`` block of a tile: ``index_map`` gives ``(b, h, tile, 0)``; packed, the
    block ``(tile, h)`` of ``[B, L, N·K]``."""
    sq = pl.squeezed
    if not packed:
        return pl.BlockSpec((sq, sq, t, K), index_map)

    def packed_map(*a):
        b, h, i, _ = index_map(*a)
        return b, i, h
    return pl.BlockSpec((sq, t, K), packed_map)


def _row_spec(t: int, index_map):
    sq = pl.squeezed
    return pl.BlockSpec((sq, sq, sq, 1, t), index_map)


def _keep_spec(t: int, index_map):
    sq = pl.squeezed
    return pl.BlockSpec((sq, sq, 1, t), index_map)


def _params(semantics):
    from jax.experimental.pallas import tpu as pltpu

    return pltpu.CompilerParams(dimension_semantics=semantics)


def _picked(N: int, T: int, topk: int):
    """The key tile of grid position ``(b, h, i, j)`` read from the flattened picks."""
    def at(b, h, i, j, picks):
        return picks[((b * N + h) * T + i) * topk + j]
    return at


# ---------------------------------------------------------------- forward


def _fwd_kernel(picks_ref, *refs, scale: float, masked: bool):
    del picks_ref                                   # read by the index maps only
    if masked:
        q_ref, k_ref, v_ref, keep_ref, o_ref, lse_ref, m_sc, l_sc, acc_sc = refs
    else:
        q_ref, k_ref, v_ref, o_ref, lse_ref, m_sc, l_sc, acc_sc = refs
    j = pl.program_id(3)

    @pl.when(j == 0)
    def _init():
        online_softmax_start(m_sc, l_sc, acc_sc)

    s = mxu_dot(q_ref[...], k_ref[...], NT)         # unscaled [t, t]
    if masked:
        s = jnp.where(keep_ref[...] != 0, s, NEG_INF)
    online_softmax_step(s, v_ref[...], m_sc, l_sc, acc_sc, scale)

    @pl.when(j == pl.num_programs(3) - 1)
    def _finish():
        online_softmax_finish(o_ref, lse_ref, m_sc, l_sc, acc_sc, scale)


def _pick_grid(q, picks):
    """What the forward and dq kernels share over the grid (B, N, query tile, pick): ``(B, N,
    L, K, packed, T, topk, t, at, q_spec, kv_spec, row_spec)``: the dims, the tiles ``T`` of
    ``t`` tokens, the pick reader ``at`` and the query, picked key / value and row specs."""
    B, N, L, K, packed = _dims(q, picks.shape[1])
    T, topk = picks.shape[2], picks.shape[3]
    t = L // T
    at = _picked(N, T, topk)
    q_spec = _spec(t, K, lambda b, h, i, j, p: (b, h, i, 0), packed)
    kv_spec = _spec(t, K, lambda b, h, i, j, p: (b, h, at(b, h, i, j, p), 0), packed)
    row_spec = _row_spec(t, lambda b, h, i, j, p: (b, h, i, 0, 0))
    return B, N, L, K, packed, T, topk, t, at, q_spec, kv_spec, row_spec


def table_forward(q, k, v, keep, picks, *, scale: float, interpret: bool):
    """q, k, v ``[B, N, L, K]`` (or packed ``[B, L, N·K]``, :func:`_dims`), keep ``[B, T, 1,
    t]`` int32 or None, picks ``[B, N, T, topk]`` int32 → ``(o float32 in q's layout, lse
    [B, N, T, 1, t] float32)``."""
    from jax.experimental.pallas import tpu as pltpu

    B, N, L, K, packed, T, topk, t, at, q_spec, kv_spec, row_spec = _pick_grid(q, picks)
    in_specs = [q_spec, kv_spec, kv_spec]
    args = [q, k, v]
    if keep is not None:
        in_specs.append(_keep_spec(t, lambda b, h, i, j, p: (b, at(b, h, i, j, p), 0, 0)))
        args.append(keep)
    grid = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(B, N, T, topk), in_specs=in_specs,
        out_specs=[q_spec, row_spec],
        scratch_shapes=[pltpu.VMEM((t, 1), F32), pltpu.VMEM((t, 1), F32),
                        pltpu.VMEM((t, K), F32)])
    return pl.pallas_call(
        functools.partial(_fwd_kernel, scale=float(scale), masked=keep is not None),
        grid_spec=grid,
        out_shape=[jax.ShapeDtypeStruct(q.shape, F32),
                   jax.ShapeDtypeStruct((B, N, T, 1, t), F32)],
        compiler_params=_params(("parallel", "parallel", "parallel", "arbitrary")),
        interpret=interpret, name="ditax_vsa_table_fwd",
    )(picks.reshape(-1).astype(jnp.int32), *args)


# ---------------------------------------------------------------- dq


def _dq_kernel(picks_ref, *refs, scale: float, masked: bool):
    del picks_ref
    if masked:
        (q_ref, k_ref, v_ref, keep_ref, do_ref, o_ref, lse_ref, dq_ref, delta_ref,
         acc_sc, delta_sc) = refs
    else:
        q_ref, k_ref, v_ref, do_ref, o_ref, lse_ref, dq_ref, delta_ref, acc_sc, delta_sc = refs
    j = pl.program_id(3)

    @pl.when(j == 0)
    def _init():
        acc_sc[...] = jnp.zeros(acc_sc.shape, F32)
        delta_sc[...] = jnp.sum(do_ref[...].astype(F32) * o_ref[...].astype(F32), axis=1,
                                keepdims=True)

    q, k, v = q_ref[...], k_ref[...], v_ref[...]
    do = do_ref[...].astype(k.dtype)                   # the MXU in the inputs' dtype
    lse = as_column(lse_ref)
    lse2 = jnp.where(lse == NEG_INF, jnp.inf, lse) * LOG2E   # a row with no key: P = 0
    s = mxu_dot(q, k, NT)
    if masked:
        s = jnp.where(keep_ref[...] != 0, s, NEG_INF)
    p = jnp.exp2(s * (scale * LOG2E) - lse2)           # exp(s·scale - lse)
    ds = p * (mxu_dot(do, v, NT) - delta_sc[...])
    acc_sc[...] += mxu_dot(ds.astype(k.dtype), k, NN)

    @pl.when(j == pl.num_programs(3) - 1)
    def _finish():
        dq_ref[...] = (acc_sc[...] * scale).astype(dq_ref.dtype)
        delta_ref[...] = delta_sc[...].T


def table_dq(q, k, v, keep, picks, do, o, lse, *, scale: float, interpret: bool):
    """``(dq in q's layout and dtype, delta [B, N, T, 1, t] float32)``."""
    from jax.experimental.pallas import tpu as pltpu

    B, N, L, K, packed, T, topk, t, at, q_spec, kv_spec, row_spec = _pick_grid(q, picks)
    in_specs, args = [q_spec, kv_spec, kv_spec], [q, k, v]
    if keep is not None:
        in_specs.append(_keep_spec(t, lambda b, h, i, j, p: (b, at(b, h, i, j, p), 0, 0)))
        args.append(keep)
    grid = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(B, N, T, topk),
        in_specs=in_specs + [q_spec, q_spec, row_spec], out_specs=[q_spec, row_spec],
        scratch_shapes=[pltpu.VMEM((t, K), F32), pltpu.VMEM((t, 1), F32)])
    return pl.pallas_call(
        functools.partial(_dq_kernel, scale=float(scale), masked=keep is not None),
        grid_spec=grid,
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                   jax.ShapeDtypeStruct((B, N, T, 1, t), F32)],
        compiler_params=_params(("parallel", "parallel", "parallel", "arbitrary")),
        interpret=interpret, name="ditax_vsa_table_dq",
    )(picks.reshape(-1).astype(jnp.int32), *args, do, o, lse)


# ---------------------------------------------------------------- dk / dv


def inverse_table(picks, key_tiles: int | None = None):
    """``picks [B, N, Tq, topk]`` (into ``key_tiles`` key tiles; None: ``Tq``) → ``[B, N,
    Tq · topk + key_tiles]`` int32: the dk/dv kernel's packed entries (module docstring),
    key tiles in increasing order, each key tile's picking query tiles in increasing order.
    jnp only (sort and scans): traced with the picks, nothing leaves the device."""
    B, N, Tq, topk = picks.shape
    T = Tq if key_tiles is None else key_tiles
    if max(T, Tq) >= MAX_TILES:
        raise ValueError(f"vsa_fine=table: {max(T, Tq)} tiles exceed the {MAX_TILES - 1} its "
                         f"dk/dv table can name; use a larger attention.tile")
    R = Tq * topk
    P = R + T
    kt_real = picks.reshape(B, N, R).astype(jnp.int32)
    qi_real = jnp.broadcast_to(jnp.arange(R, dtype=jnp.int32) // topk, (B, N, R))
    rows = jnp.arange(B * N)[:, None]
    counts = jnp.zeros((B * N, T), jnp.int32).at[rows, kt_real.reshape(B * N, R)].add(1)
    counts = counts.reshape(B, N, T)
    tiles = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, N, T))
    kt = jnp.concatenate([kt_real, tiles], -1)
    qi = jnp.concatenate([qi_real, jnp.zeros((B, N, T), jnp.int32)], -1)
    real = jnp.concatenate([jnp.ones((B, N, R), bool), jnp.zeros((B, N, T), bool)], -1)
    # a dummy entry is needed only for a key tile nobody picked; the others sort past the end
    needed = real | jnp.concatenate([jnp.zeros((B, N, R), bool), counts == 0], -1)
    key = jnp.where(needed, 2 * kt + real.astype(jnp.int32), 2 * T)
    order = jnp.argsort(key, axis=-1, stable=True)
    kt, qi, real, needed = (jnp.take_along_axis(x, order, -1) for x in (kt, qi, real, needed))
    n = jnp.sum(needed, -1, keepdims=True)                       # valid positions
    pos = jnp.arange(P, dtype=jnp.int32)
    tail = jnp.minimum(pos, n - 1)                                # spare: repeat the last
    kt, qi = (jnp.take_along_axis(x, tail, -1) for x in (kt, qi))
    live = real & (pos < n)
    edge = jnp.ones((B, N, 1), bool)
    first = jnp.concatenate([edge, kt[..., 1:] != kt[..., :-1]], -1)
    last = jnp.concatenate([kt[..., 1:] != kt[..., :-1], edge], -1)
    return (kt | (qi << 14) | (live.astype(jnp.int32) << 28) | (first.astype(jnp.int32) << 29)
            | (last.astype(jnp.int32) << 30))


def _key_tile(e):
    return jax.lax.bitwise_and(e, MAX_TILES - 1)


def _query_tile(e):
    return jax.lax.bitwise_and(jax.lax.shift_right_logical(e, 14), MAX_TILES - 1)


def _bit(e, n: int):
    return jax.lax.bitwise_and(jax.lax.shift_right_logical(e, n), 1)


def _dkv_kernel(tab_ref, *refs, scale: float, masked: bool):
    if masked:
        (q_ref, k_ref, v_ref, keep_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref,
         dk_sc, dv_sc) = refs
    else:
        q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref, dk_sc, dv_sc = refs
    b, h, p = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    e = tab_ref[(b * pl.num_programs(1) + h) * pl.num_programs(2) + p]

    @pl.when(_bit(e, 29) == 1)
    def _init():
        dk_sc[...] = jnp.zeros(dk_sc.shape, F32)
        dv_sc[...] = jnp.zeros(dv_sc.shape, F32)

    @pl.when(_bit(e, 28) == 1)
    def _tile():
        q, k, v = q_ref[...], k_ref[...], v_ref[...]
        do = do_ref[...].astype(k.dtype)
        lse = lse_ref[...]                                       # [1, t] rows of the queries
        lse2 = jnp.where(lse == NEG_INF, jnp.inf, lse) * LOG2E
        st = mxu_dot(k, q, NT)                                   # unscaled [t_k, t_q]
        if masked:
            st = jnp.where(as_column(keep_ref) != 0, st, NEG_INF)
        pt = jnp.exp2(st * (scale * LOG2E) - lse2)
        dv_sc[...] += mxu_dot(pt.astype(do.dtype), do, NN)
        dst = pt * (mxu_dot(v, do, NT) - delta_ref[...])
        dk_sc[...] += mxu_dot(dst.astype(q.dtype), q, NN)

    @pl.when(_bit(e, 30) == 1)
    def _finish():
        dk_ref[...] = (dk_sc[...] * scale).astype(dk_ref.dtype)
        dv_ref[...] = dv_sc[...].astype(dv_ref.dtype)


def table_dkv(q, k, v, keep, table, do, lse, delta, *, scale: float, interpret: bool):
    """``(dk, dv)`` in k's / v's layouts and dtypes; ``table`` from :func:`inverse_table`."""
    from jax.experimental.pallas import tpu as pltpu

    B, N, L, K, packed = _dims(q, lse.shape[1])
    T, P = lse.shape[2], table.shape[-1]            # T: the query tiles
    t = L // T

    def entry(b, h, p, tab):
        return tab[(b * N + h) * P + p]

    q_spec = _spec(t, K, lambda b, h, p, tab: (b, h, _query_tile(entry(b, h, p, tab)), 0),
                   packed)
    kv_spec = _spec(t, K, lambda b, h, p, tab: (b, h, _key_tile(entry(b, h, p, tab)), 0),
                    packed)
    row_spec = _row_spec(t, lambda b, h, p, tab: (b, h, _query_tile(entry(b, h, p, tab)), 0,
                                                   0))
    in_specs, args = [q_spec, kv_spec, kv_spec], [q, k, v]
    if keep is not None:
        in_specs.append(_keep_spec(t, lambda b, h, p, tab: (b, _key_tile(entry(b, h, p, tab)),
                                                            0, 0)))
        args.append(keep)
    grid = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(B, N, P),
        in_specs=in_specs + [q_spec, row_spec, row_spec], out_specs=[kv_spec, kv_spec],
        scratch_shapes=[pltpu.VMEM((t, K), F32), pltpu.VMEM((t, K), F32)])
    return pl.pallas_call(
        functools.partial(_dkv_kernel, scale=float(scale), masked=keep is not None),
        grid_spec=grid,
        out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype),
                   jax.ShapeDtypeStruct(v.shape, v.dtype)],
        compiler_params=_params(("parallel", "parallel", "arbitrary")),
        interpret=interpret, name="ditax_vsa_table_dkv",
    )(table.reshape(-1), *args, do, lse, delta)


__all__ = ["MAX_TILES", "SMEM_WORDS", "inverse_table", "table_dkv", "table_dq",
           "table_forward"]
