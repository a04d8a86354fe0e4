"""Pallas TPU kernels of VSA's fine pass read from a per-(sample, head, query tile) table of
picked key tiles (``attention.sparsity=vsa attention.vsa_fine=table``;
:mod:`ditax.attention.sparse.vsa_table` is the differentiable wrapper): the forward and dq
kernels here, dk / dv over the transposed table in :mod:`.vsa_table_dkv`.

Layout: q, k, v, o ``[B, N, L, K]`` head-major, or ``[B, L, N·K]`` packed where ``K`` is a
multiple of 128 (a head is a column block: the projections' layout, no transposes), ``L = T ·
t`` (``T`` tiles of ``t`` tokens, tile-major order); one kernel block is one whole tile
``(t, K)``. Per-row vectors (lse, the softmax delta, the key mask) travel as lane rows
``[B, N, T, 1, t]`` / ``[B, T, 1, t]`` (:mod:`.mosaic`).

**Groups** (``attention.vsa_group``): a grid step takes ``G`` picked key tiles at once. K and
V (and the key mask) are passed ``G`` times, the ``g``-th copy's index map reading pick ``j ·
G + g``, so Pallas DMAs the ``G`` tiles of a step together (double-buffered, issued one step
ahead) and the step's ``G`` products share one step's overhead: at ``G = 1``, Wan 1.3B 480p on
a v5e spent ~1.05 µs a step where a ``256 × 256 × 128`` tile pair takes ~0.17 µs at peak.
``topk`` is padded up to ``steps · G`` picks; a padded pick repeats the same slot's pick of the
step before (its block index unchanged: no DMA) and the last step folds only its real slots
(a second, static body: nothing masked, nothing wasted). :func:`group_for` chooses ``G``.

- **forward**, grid ``(B, N, T, steps)``: ``picks [B, N, T, steps · G]`` int32, flattened, is
  the scalar-prefetched operand (SMEM); the K / V (and key mask) index maps read the key
  tiles of position ``(b, h, i, j)`` from it, so each query tile's ``topk`` key tiles are
  DMA'd from K / V where they lie: no gathered copy. The online softmax (one running max
  over the step's ``G`` tiles) runs in VMEM scratch (float32), the output (float32) and the
  log-sum-exp row are written at the last step.
- **dq**, the same grid and table: the softmax delta ``rowsum(dO · o)`` at the first step,
  then ``dq += (P ∘ (dO vᵀ - delta)) k`` for each of the step's tiles (FlashAttention-2).

The forward takes an opt-in ``variant`` (:mod:`.vsa_variant`: exact rewrites of its fold —
the mask as a bias, lane-replicated statistics, a pre-scaled q, row slices, a rescale per
tile; the default is the plain kernel); their static schedules on a v5e are in
``docs/sparse_attention.md``, "VSA table kernel: static schedule".

SMEM holds about 1 MiB (TPU v4 … v6e); :data:`SMEM_WORDS` is the budget a caller splits its
heads to (the wrapper does). Verified here: interpret mode on CPU against the jnp VSA and the
dense reference, and lowering to Mosaic TPU (``jax.export``); ``G = 1`` measured on a v5e
(:mod:`benchmarks.vsa_table`), ``G > 1`` not yet.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from ditax.attention.kernels.mosaic import (LOG2E, NN, NT, as_column, mxu_dot,
                                            online_softmax_finish, online_softmax_start,
                                            online_softmax_steps)
from ditax.attention.kernels.vsa_variant import PLAIN, TableVariant

NEG_INF = float("-inf")
F32 = jnp.float32
MIB = 1 << 20
#: int32 words of scalar-prefetched table one call may take (half of a 1 MiB SMEM)
SMEM_WORDS = 128 * 1024
#: the largest group :func:`group_for` chooses (per-step overhead hidden well before)
MAX_GROUP = 8
#: the VMEM a group may take by :func:`vmem_estimate`: under v5e's 16 MiB scoped default,
#: which these kernels keep (they ask for no limit of their own)
VMEM_BUDGET = 12 * MIB


def vmem_estimate(t: int, K: int, itemsize: int, group: int) -> int:
    """Bytes of VMEM the heaviest of the three kernels takes with ``group`` tiles a step (an
    upper estimate): per slot two double-buffered ``(t, K)`` tiles (k and v; q and dO in dk /
    dv), its lane rows padded to 8 sublanes, and two ``[t, t]`` float32 score tiles (the
    forward holds every slot's scores for the common max); fixed: q / dO / o blocks and the
    float32 accumulators, and five ``[t, t]`` float32 tiles of the backward."""
    slot = 4 * t * K * itemsize + 4 * 8 * t * 4 + 2 * t * t * 4
    return 12 * t * K * 4 + 5 * t * t * 4 + group * slot


def group_for(topk: int, t: int, K: int, itemsize: int) -> int:
    """``G`` for ``topk`` picks of ``t``-token tiles of head dim ``K``: the fewest steps that
    groups of at most :data:`MAX_GROUP` (and :data:`VMEM_BUDGET`) tiles take, with the smallest
    group that many steps need (``topk`` 21 / 42 / 84 → 7 / 7 / 8 at ``t = 256``, ``K =
    128``)."""
    fit = [g for g in range(2, MAX_GROUP + 1) if vmem_estimate(t, K, itemsize, g) <= VMEM_BUDGET]
    widest = min(topk, max(fit, default=1))
    steps = -(-topk // widest)
    return -(-topk // steps)


def resolve_group(group: int, topk: int, t: int, K: int, itemsize: int) -> int:
    """The group the kernels run: ``group`` (0: :func:`group_for`), at most ``topk`` (a larger
    one folds the same picks); ValueError for a negative one or one past the VMEM budget."""
    if isinstance(group, bool) or not isinstance(group, int) or group < 0:
        raise ValueError(f"attention.vsa_group={group!r} must be an int >= 0 (0: chosen per "
                         f"shape, 1: one key tile a grid step), e.g. attention.vsa_group=4")
    if group == 0:
        return group_for(topk, t, K, itemsize)
    g = min(group, topk)
    need = vmem_estimate(t, K, itemsize, g)
    if need > VMEM_BUDGET:
        fit = max([n for n in range(1, g) if vmem_estimate(t, K, itemsize, n) <= VMEM_BUDGET],
                  default=1)
        raise ValueError(f"attention.vsa_group={group}: {g} key tiles of {t} x {K} a grid step "
                         f"take about {need / MIB:.1f} MiB of VMEM, over the "
                         f"{VMEM_BUDGET // MIB} MiB budget; use attention.vsa_group<={fit} or 0")
    return g


def dims(q, heads: int):
    """``(B, N, L, K, packed)`` of ``q``: ``[B, N, L, K]`` head-major, or ``[B, L, N·K]``
    packed (``N = heads``; a head is a column block of ``K``: a multiple of 128 lanes)."""
    if q.ndim == 4:
        B, N, L, K = q.shape
        return B, N, L, K, False
    B, L, NK = q.shape
    return B, heads, L, NK // heads, True


def tile_spec(t: int, K: int, index_map, packed: bool = False):
    """The ``(t, K)`` block of a tile: ``index_map`` gives ``(b, h, tile, 0)``; packed, the
    block ``(tile, h)`` of ``[B, L, N·K]``."""
    sq = pl.squeezed
    if not packed:
        return pl.BlockSpec((sq, sq, t, K), index_map)

    def packed_map(*a):
        b, h, i, _ = index_map(*a)
        return b, i, h
    return pl.BlockSpec((sq, t, K), packed_map)


def row_spec(t: int, index_map):
    sq = pl.squeezed
    return pl.BlockSpec((sq, sq, sq, 1, t), index_map)


def keep_spec(t: int, index_map):
    sq = pl.squeezed
    return pl.BlockSpec((sq, sq, 1, t), index_map)


def params(semantics):
    from jax.experimental.pallas import tpu as pltpu

    return pltpu.CompilerParams(dimension_semantics=semantics)


def padded_picks(picks, group: int):
    """``picks [..., topk]`` → ``[..., steps · group]``: a padded position repeats the pick one
    step (``group`` positions) before it, the same slot's (no new DMA)."""
    topk = picks.shape[-1]
    width = -(-topk // group) * group
    if width == topk:
        return picks
    pos = jnp.arange(width)
    return picks[..., jnp.where(pos < topk, pos, pos - group)]


@dataclass(frozen=True)
class PickGrid:
    """What the forward and dq kernels share over the grid ``(B, N, query tile, step)``: the
    dims, ``T`` tiles of ``t`` tokens, ``steps`` of ``group`` picks (``last``: the real ones
    of the last step), the flattened padded picks and the block specs."""

    B: int
    N: int
    K: int
    T: int
    t: int
    group: int
    steps: int
    last: int
    flat: Any
    q_spec: Any
    kv_specs: list
    keep_specs: list
    row_spec: Any

    @classmethod
    def of(cls, q, picks, group: int, masked: bool) -> "PickGrid":
        B, N, L, K, packed = dims(q, picks.shape[1])
        T, topk = picks.shape[2], picks.shape[3]
        t, G = L // T, group
        steps = -(-topk // G)
        W = steps * G

        def at(b, h, i, j, g, p):
            return p[((b * N + h) * T + i) * W + j * G + g]

        kv_specs = [tile_spec(t, K, lambda b, h, i, j, p, g=g: (b, h, at(b, h, i, j, g, p), 0),
                              packed) for g in range(G)]
        keep_specs = [keep_spec(t, lambda b, h, i, j, p, g=g: (b, at(b, h, i, j, g, p), 0, 0))
                      for g in range(G)] if masked else []
        return cls(B, N, K, T, t, G, steps, topk - (steps - 1) * G,
                   padded_picks(picks.astype(jnp.int32), G).reshape(-1),
                   tile_spec(t, K, lambda b, h, i, j, p: (b, h, i, 0), packed), kv_specs,
                   keep_specs, row_spec(t, lambda b, h, i, j, p: (b, h, i, 0, 0)))

    def tiles(self, q, k, v, keep):
        """The in-specs and operands q, ``G`` x k, ``G`` x v (and ``G`` x the key mask)."""
        G = self.group
        specs = [self.q_spec] + self.kv_specs * 2 + self.keep_specs
        return specs, [q] + [k] * G + [v] * G + ([keep] * G if keep is not None else [])


def _split(refs, group: int, masked: bool):
    """A grouped kernel's refs: ``(q, ks, vs, keeps or None, the rest)``."""
    G = group
    end = 1 + (3 if masked else 2) * G
    keeps = refs[1 + 2 * G:end] if masked else None
    return refs[0], refs[1:1 + G], refs[1 + G:1 + 2 * G], keeps, refs[end:]


def _scores(q, k, keep_ref, bias: bool = False):
    s = mxu_dot(q, k, NT)                               # unscaled [t, t]
    if keep_ref is None:
        return s
    return s + keep_ref[...] if bias else jnp.where(keep_ref[...] != 0, s, NEG_INF)


def _by_step(fold, group: int, last: int, j, steps) -> None:
    """``fold(group)`` at every step, ``fold(last)`` at the last one where it has padded
    slots (not computed; their tiles not fetched: the index maps repeat the step before)."""
    if last == group:
        fold(group)
        return
    pl.when(j < steps - 1)(lambda: fold(group))
    pl.when(j == steps - 1)(lambda: fold(last))


# ---------------------------------------------------------------- forward


def _fwd_kernel(picks_ref, *refs, scale: float, group: int, last: int, masked: bool,
                variant: TableVariant = PLAIN):
    del picks_ref                                   # read by the index maps only
    q_ref, ks, vs, keeps, (o_ref, lse_ref, m_sc, l_sc, acc_sc) = _split(refs, group, masked)
    j, steps = pl.program_id(3), pl.num_programs(3)
    soft = variant.soft

    @pl.when(j == 0)
    def _init():
        online_softmax_start(m_sc, l_sc, acc_sc)

    def fold_rows(n, rows, state):
        q = variant.query(q_ref if rows is None else q_ref.at[rows], scale)
        for part in variant.parts(n):
            ss = [_scores(q, ks[g][...], keeps and keeps[g], variant.bias) for g in part]
            online_softmax_steps(ss, [vs[g][...] for g in part], *state, scale,
                                 log2=soft.prescale, pv_f32=soft.pv_f32)

    def fold(n):
        t = q_ref.shape[0]
        r = variant.row_block(t, n)
        if r == t:
            return fold_rows(n, None, (m_sc, l_sc, acc_sc))

        def body(i, carry):
            rows = pl.ds(pl.multiple_of(i * r, r), r)
            fold_rows(n, rows, [x.at[rows] for x in (m_sc, l_sc, acc_sc)])
            return carry
        jax.lax.fori_loop(0, t // r, body, 0, unroll=True)

    _by_step(fold, group, last, j, steps)

    @pl.when(j == steps - 1)
    def _finish():
        online_softmax_finish(o_ref, lse_ref, m_sc, l_sc, acc_sc, soft.units(scale))


def table_forward(q, k, v, keep, picks, *, scale: float, interpret: bool, group: int = 1,
                  variant=PLAIN):
    """q, k, v ``[B, N, L, K]`` (or packed ``[B, L, N·K]``, :func:`dims`), keep ``[B, T, 1,
    t]`` int32 or None, picks ``[B, N, T, topk]`` int32, ``group`` (``1 .. topk``) key
    tiles a step, ``variant`` (:class:`~.vsa_variant.TableVariant` or its name; default the
    plain kernel) → ``(o float32 in q's layout, lse [B, N, T, 1, t] float32)``."""
    from jax.experimental.pallas import tpu as pltpu

    variant = TableVariant.parse(variant)
    keep = variant.mask_operand(keep)
    pg = PickGrid.of(q, picks, group, keep is not None)
    in_specs, args = pg.tiles(q, k, v, keep)
    w = variant.soft.stat_width()
    grid = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(pg.B, pg.N, pg.T, pg.steps), in_specs=in_specs,
        out_specs=[pg.q_spec, pg.row_spec],
        scratch_shapes=[pltpu.VMEM((pg.t, w), F32), pltpu.VMEM((pg.t, w), F32),
                        pltpu.VMEM((pg.t, pg.K), F32)])
    return pl.pallas_call(
        functools.partial(_fwd_kernel, scale=float(scale), group=group, last=pg.last,
                          masked=keep is not None, variant=variant),
        grid_spec=grid,
        out_shape=[jax.ShapeDtypeStruct(q.shape, F32),
                   jax.ShapeDtypeStruct((pg.B, pg.N, pg.T, 1, pg.t), F32)],
        compiler_params=params(("parallel", "parallel", "parallel", "arbitrary")),
        interpret=interpret, name="ditax_vsa_table_fwd",
    )(pg.flat, *args)


# ---------------------------------------------------------------- dq


def _dq_kernel(picks_ref, *refs, scale: float, group: int, last: int, masked: bool):
    del picks_ref
    q_ref, ks, vs, keeps, rest = _split(refs, group, masked)
    do_ref, o_ref, lse_ref, dq_ref, delta_ref, acc_sc, delta_sc = rest
    j, steps = pl.program_id(3), pl.num_programs(3)

    @pl.when(j == 0)
    def _init():
        acc_sc[...] = jnp.zeros(acc_sc.shape, F32)
        delta_sc[...] = jnp.sum(do_ref[...].astype(F32) * o_ref[...].astype(F32), axis=1,
                                keepdims=True)

    def fold(n):
        q = q_ref[...]
        do = do_ref[...].astype(q.dtype)                    # the MXU in the inputs' dtype
        lse = as_column(lse_ref)
        lse2 = jnp.where(lse == NEG_INF, jnp.inf, lse) * LOG2E   # a row with no key: P = 0
        acc = acc_sc[...]
        for g in range(n):
            k = ks[g][...]
            p = jnp.exp2(_scores(q, k, keeps and keeps[g]) * (scale * LOG2E) - lse2)
            ds = p * (mxu_dot(do, vs[g][...], NT) - delta_sc[...])
            acc = acc + mxu_dot(ds.astype(k.dtype), k, NN)
        acc_sc[...] = acc

    _by_step(fold, group, last, j, steps)

    @pl.when(j == steps - 1)
    def _finish():
        dq_ref[...] = (acc_sc[...] * scale).astype(dq_ref.dtype)
        delta_ref[...] = delta_sc[...].T


def table_dq(q, k, v, keep, picks, do, o, lse, *, scale: float, interpret: bool,
             group: int = 1):
    """``(dq in q's layout and dtype, delta [B, N, T, 1, t] float32)``."""
    from jax.experimental.pallas import tpu as pltpu

    pg = PickGrid.of(q, picks, group, keep is not None)
    in_specs, args = pg.tiles(q, k, v, keep)
    grid = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(pg.B, pg.N, pg.T, pg.steps),
        in_specs=in_specs + [pg.q_spec, pg.q_spec, pg.row_spec],
        out_specs=[pg.q_spec, pg.row_spec],
        scratch_shapes=[pltpu.VMEM((pg.t, pg.K), F32), pltpu.VMEM((pg.t, 1), F32)])
    return pl.pallas_call(
        functools.partial(_dq_kernel, scale=float(scale), group=group, last=pg.last,
                          masked=keep is not None),
        grid_spec=grid,
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                   jax.ShapeDtypeStruct((pg.B, pg.N, pg.T, 1, pg.t), F32)],
        compiler_params=params(("parallel", "parallel", "parallel", "arbitrary")),
        interpret=interpret, name="ditax_vsa_table_dq",
    )(pg.flat, *args, do, o, lse)


__all__ = ["MAX_GROUP", "SMEM_WORDS", "VMEM_BUDGET", "group_for", "padded_picks",
           "resolve_group", "table_dq", "table_forward", "vmem_estimate"]
