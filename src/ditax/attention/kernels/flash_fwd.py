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
- kv_keep ``[B, Uk, Lk_c]`` int32 (1 = attend), lse ``[U, B, N, Lc, 1]`` float32 (inside the
  kernel both travel as lane rows ``[..., n, 1, block]``, see :mod:`.mosaic`).
- optional o_prev / lse_prev (o's and lse's layout): a partial over earlier keys that the
  online softmax starts from (ring steps merge here, on ``[block_q, K]`` tiles, instead of in
  an elementwise jnp merge whose compiled form — FMA contraction — depends on the layout).

Grid ``(B, N, U·cdiv(Lc, block_q), Uk·cdiv(Lk_c, block_kv))``: one program per (query block,
key block) tile; the key axis is innermost and sequential ("arbitrary"), and the online-softmax
state (running max ``m``, denominator ``l``, accumulator ``acc``, float32) lives in VMEM
scratch across it, started empty or from (o_prev, lse_prev). Only ``[block, K]`` tiles are
resident, so VMEM use does not grow with the sequence. The key index map walks shard-major
(shard ``j // cdiv(Lk_c, block_kv)``, block ``j % ...`` inside it).

Verified here: interpret mode on CPU (tests/attention/test_flash.py), and lowering to Mosaic TPU via
``jax.export(platforms=["tpu"])`` (tests/attention/test_flash.py) — not yet run on a TPU. On GPUs this
kernel does not apply (Mosaic-TPU scratch and grid semantics): ``flash`` refuses there.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from ditax.attention.kernels.flash_sparse import block_lists, live, pallas_call, when
from ditax.attention.kernels.flash_variant import PLAIN, Variant
from ditax.attention.kernels.mosaic import (
    NT,
    as_column,
    mxu_dot,
    online_softmax_finish,
    online_softmax_start,
    online_softmax_step,
)
from ditax.intmath import ceil_div

NEG_INF = float("-inf")


def _kernel(*refs, scale: float, has_prev: bool, mask: str = "none", partial: bool = False,
            nkv: int = 1, block_kv_compute: int | None = None, sparse: bool = False,
            width: int = 1, variant: Variant = PLAIN):
    """One (query block, key block) tile of the online softmax; grid axis 3 walks the keys.

    The running max ``m``, denominator ``l`` and accumulator ``acc`` live in VMEM scratch
    across the key axis (``arbitrary``, innermost); the output block stays resident and is
    written once, at the last key block. The key block is consumed in sub-blocks of
    ``block_kv_compute`` keys (default: all of it): large key blocks mean few grid steps and
    long DMAs, small compute blocks keep the ``[block_q, block_kv_compute]`` float32 scores
    in VMEM.

    ``mask``: where keys are masked — ``"none"`` (every key valid, no select at all),
    ``"last"`` (only each shard's last key block, of ``nkv``, holds masked keys: the lengths'
    padding; the other blocks run unmasked), ``"all"`` (a caller's key mask: every block).
    ``partial``: the last key block reads past the array (unspecified values, maybe NaN, and
    ``0 * NaN`` would reach the output), so its masked keys' value rows are zeroed: they add
    exact zeros, as zero padding did.
    ``sparse``: the block lists come first in ``refs`` and grid axis 3 walks their ``width``
    positions, computing on the live ones only (:mod:`.flash_sparse`).
    ``variant``: the block loop's variant (:mod:`.flash_variant`; with ``prescale`` a VMEM
    copy of the scaled q block follows the scratch).
    """
    refs, kv_block, alive = live(refs, sparse, width)
    qs_sc = None
    if variant.prescale:
        *refs, qs_sc = refs
    if has_prev:
        (q_ref, k_ref, v_ref, keep_ref, o_prev_ref, lse_prev_ref, o_ref, lse_ref,
         m_sc, l_sc, acc_sc) = refs
    else:
        q_ref, k_ref, v_ref, keep_ref, o_ref, lse_ref, m_sc, l_sc, acc_sc = refs
    j = pl.program_id(3)
    last = pl.num_programs(3) - 1
    units = variant.units(scale)                    # score units -> natural log

    @pl.when(j == 0)
    def _init():
        if has_prev:
            online_softmax_start(m_sc, l_sc, acc_sc, units, as_column(lse_prev_ref),
                                 o_prev_ref[...])
        else:
            online_softmax_start(m_sc, l_sc, acc_sc)
        if qs_sc is not None:                       # q in log2 units, once per query block
            qs_sc[...] = (q_ref[...].astype(jnp.float32)
                          * variant.q_factor(scale)).astype(qs_sc.dtype)

    bkv = k_ref.shape[0]
    bc = bkv if block_kv_compute is None else block_kv_compute
    q = q_ref[...] if qs_sc is None else qs_sc[...]  # [bq, K]

    def tiles(masked: bool):
        def sub(c, carry):
            rows = pl.ds(pl.multiple_of(c * bc, bc), bc)
            k, v = k_ref[rows, :], v_ref[rows, :]    # [bc, K]
            s = mxu_dot(q, k, NT)                    # unscaled scores [bq, bc]
            if masked:
                keep = keep_ref[:, rows]             # [1, bc]
                if partial:
                    v = jnp.where(jnp.expand_dims(keep[0], -1) != 0, v, jnp.zeros_like(v))
                s = jnp.where(keep != 0, s, NEG_INF)
            online_softmax_step(s, v, m_sc, l_sc, acc_sc, units, log2=variant.prescale,
                                pv_f32=variant.pv_f32)
            return carry

        if bkv == bc:
            sub(0, 0)
        else:                 # plain: a loop, not unrolled (compile time); variant: unrolled
            jax.lax.fori_loop(0, bkv // bc, sub, 0, unroll=variant.unroll)

    when(alive, lambda: by_mask(tiles, mask, kv_block, nkv))

    @pl.when(j == last)
    def _finish():
        online_softmax_finish(o_ref, lse_ref, m_sc, l_sc, acc_sc, units)


def by_mask(tile, mask: str, j, nkv: int) -> None:
    """Run ``tile(masked)`` for key block ``j`` (the forward's and backward's kernels alike):
    masked on every block (``"all"``), on each shard's last of ``nkv`` blocks only
    (``"last"``), or never (``"none"``)."""
    if mask == "all":
        tile(True)
    elif mask == "last":
        edge = jax.lax.rem(j, nkv) == nkv - 1
        pl.when(jnp.logical_not(edge))(lambda: tile(False))
        pl.when(edge)(lambda: tile(True))
    else:
        tile(False)


def mask_kind(masked_keys: bool, partial: bool) -> str:
    """The kernel's ``mask``: ``"all"`` with a caller's key mask, ``"last"`` when only the
    lengths' padding (the last key block) masks keys, else ``"none"``."""
    return "all" if masked_keys else "last" if partial else "none"


def compute_block(block_kv: int, block_kv_compute: int | None) -> int | None:
    """``block_kv_compute`` as the kernels take it: None (the whole key block) unless it is
    smaller than ``block_kv`` and divides it (ValueError naming both otherwise)."""
    if block_kv_compute is None or block_kv_compute >= block_kv:
        return None
    if block_kv % block_kv_compute or block_kv_compute % 8:
        raise ValueError(f"flash: block_kv_compute={block_kv_compute} must divide "
                         f"block_kv={block_kv} and be a multiple of 8")
    return block_kv_compute


class Tune(NamedTuple):
    """How the flash kernels run, beside their blocks (hashable: a static argument).

    ``masked``: whether a caller's key mask may mask any key (False: only the lengths'
    padding does, so only each shard's last key block needs a select); ``block_kv_compute``:
    keys per inner step of the forward (None: the whole key block); ``vmem_limit``: the
    kernels' scoped-VMEM limit in bytes (None: the compiler's default, 16 MiB on v5e);
    ``block_q_bwd`` / ``block_kv_bwd``: the backward's tiles; ``table``: a
    :class:`~ditax.attention.sparse.masks.BlockTable` whose dead blocks the kernels skip
    (:mod:`.flash_sparse`; one shard, no previous partial), None: dense; ``variant``: the
    forward's block-loop variant (:mod:`.flash_variant`; default: the plain kernel)."""

    masked: bool = True
    block_kv_compute: Optional[int] = None
    vmem_limit: Optional[int] = None
    block_q_bwd: Optional[int] = None    # the backward kernels' tiles (None: the forward's;
    block_kv_bwd: Optional[int] = None   # they must divide them)
    table: Any = None
    variant: Variant = PLAIN


def compiler_params(tune: Tune, semantics=("parallel", "parallel", "parallel", "arbitrary")):
    """The Mosaic compiler parameters of a flash kernel: the grid's semantics and the
    scoped-VMEM limit its blocks need."""
    from jax.experimental.pallas import tpu as pltpu

    return pltpu.CompilerParams(dimension_semantics=semantics,
                                vmem_limit_bytes=tune.vmem_limit)


def flash_forward_shard_major(q, k, v, kv_keep, o_prev=None, lse_prev=None, *, scale: float,
                              block_q: int, block_kv: int, interpret: bool,
                              tune: Tune = Tune()):
    """Run the kernel. q ``[U, B, N, Lc, K]``, k/v ``[Uk, B, N, Lk_c, K]``,
    kv_keep ``[B, Uk, Lk_c]`` int32.

    ``o_prev`` ``[U, B, N, Lc, K]`` / ``lse_prev`` ``[U, B, N, Lc, 1]`` float32 (both or
    neither): a normalised partial result over *other* keys (an earlier ring step); the
    kernel continues its online softmax from it, so the output covers both key sets. The
    merge then happens on the kernel's own ``[block_q, K]`` tiles, whatever the layout.

    Shard lengths need not be block multiples: each shard is walked in ``cdiv`` blocks, its
    last one partial (read past the shard: unspecified rows; keys there masked through the
    zero-padded ``kv_keep`` and their value rows zeroed, query rows there never written).
    That visits exactly the keys, in the same blocks and order, of the zero-padded shards
    of ``cdiv`` whole blocks — the values are bit-identical to padding first — and needs no
    padded copy of q / k / v (the head-major Ulysses and ring paths, ``out_a2a`` modes
    included, rely on it).
    Returns ``(out [U, B, N, Lc, K], lse [U, B, N, Lc, 1] float32)``; out has o_prev's dtype
    when given, else q's.
    """
    U, B, N, Lc, K = q.shape
    Uk, Lkc = k.shape[0], k.shape[3]
    has_prev = o_prev is not None
    if has_prev != (lse_prev is not None):
        raise ValueError("flash kernel: give o_prev and lse_prev together (or neither)")
    if has_prev and (o_prev.shape != q.shape or lse_prev.shape != (U, B, N, Lc, 1)):
        raise ValueError(f"flash kernel: o_prev{o_prev.shape} / lse_prev{lse_prev.shape} must be "
                         f"{q.shape} / {(U, B, N, Lc, 1)}")
    nq, nkv = ceil_div(Lc, block_q), ceil_div(Lkc, block_kv)
    lists = sparse_lists(tune, U, Uk, Lc, Lkc, block_q, block_kv)
    sq = pl.squeezed
    q_map, kv_map = shard_major_maps(nq, nkv)
    q_spec = pl.BlockSpec((sq, sq, sq, block_q, K), q_map)
    kv_spec = pl.BlockSpec((sq, sq, sq, block_kv, K), kv_map)
    # Mask and lse as lane rows [..., n, 1, block] (kernels.mosaic): the former mask block
    # (1, block_kv) over [B, 1, Uk*Lk_c] did not lower for block_kv % 128 != 0 unless it was
    # the whole axis ("The Pallas TPU lowering currently requires that the last two dimensions
    # of your block shape are divisible by 8 and 128 respectively, or be equal to the
    # respective dimensions of the overall array"), and the former lse column [.., Lc, 1] was
    # tiled (8, 128) in HBM: 128x its size, written per call.
    keep_spec = pl.BlockSpec((sq, sq, 1, block_kv), lambda b, h, i, j: (b, j, 0, 0))
    lse_spec = pl.BlockSpec((sq, sq, sq, sq, 1, block_q), lambda *g: q_map(*g) + (0,))
    partial = Lkc % block_kv != 0
    kernel = functools.partial(_kernel, scale=float(scale), has_prev=has_prev,
                               mask=mask_kind(tune.masked, partial), partial=partial,
                               nkv=nkv, block_kv_compute=compute_block(
                                   block_kv, tune.block_kv_compute),
                               sparse=lists is not None, width=lists[2] if lists else 1,
                               variant=tune.variant)
    in_specs = [q_spec, kv_spec, kv_spec, keep_spec] + ([q_spec, lse_spec] if has_prev else [])
    keep = pad_rows(kv_keep, nkv * block_kv, 0).reshape(B, Uk * nkv, 1, block_kv)
    rows = (U, B, N, nq, 1, block_q)
    args = (q, k, v, keep)
    if has_prev:
        args += (o_prev, pad_rows(lse_prev.astype(jnp.float32)[..., 0], nq * block_q,
                                  NEG_INF).reshape(rows),)
    out_dtype = o_prev.dtype if has_prev else q.dtype
    o, lse = run_forward(kernel, (B, N, U * nq, Uk * nkv), in_specs, q_spec, lse_spec, args,
                         jax.ShapeDtypeStruct(q.shape, out_dtype), rows, block_q, K,
                         interpret=interpret, name="ditax_flash_fwd", tune=tune, lists=lists)
    return o, lse.reshape(U, B, N, nq * block_q)[..., :Lc, None]


def sparse_lists(tune: Tune, U: int, Uk: int, rows: int, cols: int, block_r: int,
                 block_c: int, transpose: bool = False):
    """The block lists of ``tune.table`` (:func:`~.flash_sparse.block_lists`), or None without
    one; a table over shard-major shards (``U`` or ``Uk`` > 1) is refused. A previous partial
    is fine: a ring step continues from it on its live blocks (a row with none keeps it)."""
    if tune.table is None:
        return None
    if U != 1 or Uk != 1:
        raise ValueError("flash with a block table runs on one shard-major shard (the Ulysses "
                         "kernel path takes no table); use out_a2a=flat or chunked")
    return block_lists(tune.table, rows, cols, block_r, block_c, transpose)


def shard_major_maps(nq: int, nkv: int):
    """Index maps ``(q_map, kv_map)`` of grid ``(b, h, i, j)`` into ``[U, B, N, L, K]``:
    query block ``i`` is block ``i % nq`` of shard ``i // nq``, key block ``j`` likewise
    (``nq`` / ``nkv`` blocks a shard; the flash and sage forward kernels)."""
    div, rem = jax.lax.div, jax.lax.rem   # (no floor-division sign fix-ups in index maps)

    def q_map(b, h, i, j):
        return div(i, nq), b, h, rem(i, nq), 0

    def kv_map(b, h, i, j):
        return div(j, nkv), b, h, rem(j, nkv), 0

    return q_map, kv_map


def pad_rows(x, n: int, value):
    """``x [..., l]`` padded with ``value`` to ``[..., n]`` (a no-op when ``l == n``): the
    per-row vectors (key mask, lse, softmax delta) of a partial last block, which travel as
    whole lane rows."""
    extra = n - x.shape[-1]
    if not extra:
        return x
    return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, extra)], constant_values=value)


def run_forward(kernel, grid, in_specs, q_spec, lse_spec, args, out, rows, block_q: int,
                K: int, *, interpret: bool, name: str, tune: Tune = Tune(), lists=None):
    """The forward ``pallas_call`` both layouts share: grid ``(B, N, query blocks, key
    blocks)`` (the last one sequential: the online softmax), outputs ``out`` (o's
    ``ShapeDtypeStruct``, tiled like q) and float32 lse ``rows``, scratch for the running max,
    sum and ``[block_q, K]`` accumulator. With a previous partial (``args`` ends with o_prev
    and its lse rows) the outputs are written over it (aliased): a ring step continues in
    place instead of XLA copying the carried float32 output every step (each output block
    is read as o_prev before it is written, and no other block reads it). ``lists``: the
    block lists of a block-sparse call (:func:`~.flash_sparse.pallas_call`)."""
    from jax.experimental.pallas import tpu as pltpu

    # input indices count the scalar-prefetched block lists of a sparse call (two) first
    first = len(args) - 2 + (2 if lists is not None else 0)
    aliases = {first: 0, first + 1: 1} if len(in_specs) == 6 else {}

    return pallas_call(
        kernel,
        lists=lists,
        grid=grid,
        in_specs=in_specs,
        out_specs=[q_spec, lse_spec],
        out_shape=[out, jax.ShapeDtypeStruct(rows, jnp.float32)],
        scratch_shapes=[pltpu.VMEM((block_q, tune.variant.stat_width()), jnp.float32),
                        pltpu.VMEM((block_q, tune.variant.stat_width()), jnp.float32),
                        pltpu.VMEM((block_q, K), jnp.float32)]
        + ([pltpu.VMEM((block_q, K), args[0].dtype)] if tune.variant.prescale else []),
        compiler_params=compiler_params(tune),
        interpret=interpret,
        name=name,
        input_output_aliases=aliases,
    )(*args)
