"""The dk / dv kernel of VSA's table fine pass (:mod:`.vsa_table` has the forward and dq) and
the transposed table it walks.

Grid ``(B, N, P)`` of steps, each one key tile and up to ``G`` (the group,
``attention.vsa_group``) of the query tiles that picked it. The transposed table
(:func:`inverse_table`, built with jnp on the device: no host round trip) lists each key tile
in order with its picking query tiles, ``G`` a step, so a key tile's steps are consecutive:
its ``dk`` / ``dv`` output blocks stay resident across them and are written once at the last.
``P = Tq · topk // G + T`` steps cover every key tile's ``max(1, ceil(picks / G))`` (``Tq``
query tiles of ``T`` key tiles: a call over part of the query tiles computes its share). A
slot past a key tile's picks is dead (skipped) and repeats its query tile of the step
before (no new DMA); a key tile no query tile picked gets one dead step (its gradients
zero); the spare steps at the end repeat the last key tile, dead. Each slot packs ``key tile
| query tile << 14 | live << 28 | first << 29 | last << 30`` in one int32 (first / last: of
the key tile's steps), so the table is one SMEM operand of ``B · N · P · G`` words.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from ditax.attention.kernels.mosaic import LOG2E, NN, NT, as_column, mxu_dot
from ditax.attention.kernels.vsa_table import (F32, NEG_INF, dims, keep_spec, params,
                                               row_spec, tile_spec)

#: tiles the packed dk/dv table can name (14 bits a tile id)
MAX_TILES = 1 << 14


def inverse_table(picks, key_tiles: int | None = None, group: int = 1):
    """``picks [B, N, Tq, topk]`` (into ``key_tiles`` key tiles; None: ``Tq``) → ``[B, N, P,
    group]`` int32, ``P = Tq · topk // group + key_tiles``: the dk/dv kernel's packed slots
    (module docstring), key tiles in increasing order, each key tile's picking query tiles in
    increasing order, ``group`` a step. jnp only (sorts, scans, searches): traced with the
    picks, nothing leaves the device."""
    B, N, Tq, topk = picks.shape
    T = Tq if key_tiles is None else key_tiles
    G = group
    if max(T, Tq) >= MAX_TILES:
        raise ValueError(f"vsa_fine=table: {max(T, Tq)} tiles exceed the {MAX_TILES - 1} its "
                         f"dk/dv table can name; use a larger attention.tile")
    R = Tq * topk
    P = R // G + T
    kt = picks.reshape(B * N, R).astype(jnp.int32)
    # stable: each key tile's picks in the order of their query tiles (position // topk)
    qi_sorted = (jnp.argsort(kt, axis=-1, stable=True) // topk).astype(jnp.int32)
    counts = jnp.zeros((B * N, T), jnp.int32).at[jnp.arange(B * N)[:, None], kt].add(1)
    start = jnp.cumsum(counts, -1) - counts                 # a key tile's first sorted pick
    steps = jnp.maximum(1, -(-counts // G))
    row_end = jnp.cumsum(steps, -1)
    r = jnp.arange(P, dtype=jnp.int32)
    tile = jnp.minimum(jax.vmap(lambda e: jnp.searchsorted(e, r, side="right"))(row_end),
                       T - 1).astype(jnp.int32)             # [B·N, P]; spare steps: the last

    def at(x):
        return jnp.take_along_axis(x, tile, -1)

    rank = (r - at(row_end - steps))[..., None] * G + jnp.arange(G)        # [B·N, P, G]
    live = (rank < at(counts)[..., None]) & (r < row_end[:, -1:])[..., None]
    src = jnp.minimum(at(start)[..., None] + rank, R - 1).reshape(B * N, P * G)
    qi = jnp.take_along_axis(qi_sorted, src, -1).reshape(B * N, P, G)
    # a dead slot keeps the slot's query tile of the step before (none before: tile 0)
    seen = jax.lax.cummax(jnp.where(live, r[:, None], -1), axis=1)
    qi = jnp.where(seen >= 0, jnp.take_along_axis(qi, jnp.maximum(seen, 0), 1), 0)
    edge = jnp.ones((B * N, 1), bool)
    first = jnp.concatenate([edge, tile[:, 1:] != tile[:, :-1]], -1)
    last = jnp.concatenate([tile[:, 1:] != tile[:, :-1], edge], -1)
    bits = (first.astype(jnp.int32) << 29) | (last.astype(jnp.int32) << 30)
    e = tile[..., None] | (qi << 14) | (live.astype(jnp.int32) << 28) | bits[..., None]
    return e.reshape(B, N, P, G)


def _key_tile(e):
    return jax.lax.bitwise_and(e, MAX_TILES - 1)


def _query_tile(e):
    return jax.lax.bitwise_and(jax.lax.shift_right_logical(e, 14), MAX_TILES - 1)


def _bit(e, n: int):
    return jax.lax.bitwise_and(jax.lax.shift_right_logical(e, n), 1)


def _dkv_kernel(tab_ref, *refs, scale: float, group: int, masked: bool):
    G = group
    qs, k_ref, v_ref = refs[:G], refs[G], refs[G + 1]
    keep_ref = refs[G + 2] if masked else None
    rest = refs[G + 2 + int(masked):]
    dos, lses, deltas = rest[:G], rest[G:2 * G], rest[2 * G:3 * G]
    dk_ref, dv_ref, dk_sc, dv_sc = rest[3 * G:]
    b, h, p = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    base = ((b * pl.num_programs(1) + h) * pl.num_programs(2) + p) * G
    e = tab_ref[base]

    @pl.when(_bit(e, 29) == 1)
    def _init():
        dk_sc[...] = jnp.zeros(dk_sc.shape, F32)
        dv_sc[...] = jnp.zeros(dv_sc.shape, F32)

    for g in range(G):
        @pl.when(_bit(tab_ref[base + g], 28) == 1)
        def _slot(g=g):
            q, k, v = qs[g][...], k_ref[...], v_ref[...]
            do = dos[g][...].astype(k.dtype)
            lse = lses[g][...]                                   # [1, t] rows of the queries
            lse2 = jnp.where(lse == NEG_INF, jnp.inf, lse) * LOG2E
            st = mxu_dot(k, q, NT)                               # unscaled [t_k, t_q]
            if masked:
                st = jnp.where(as_column(keep_ref) != 0, st, NEG_INF)
            pt = jnp.exp2(st * (scale * LOG2E) - lse2)
            dv_sc[...] += mxu_dot(pt.astype(do.dtype), do, NN)
            dst = pt * (mxu_dot(v, do, NT) - deltas[g][...])
            dk_sc[...] += mxu_dot(dst.astype(q.dtype), q, NN)

    @pl.when(_bit(e, 30) == 1)
    def _finish():
        dk_ref[...] = (dk_sc[...] * scale).astype(dk_ref.dtype)
        dv_ref[...] = dv_sc[...].astype(dv_ref.dtype)


def table_dkv(q, k, v, keep, table, do, lse, delta, *, scale: float, interpret: bool):
    """``(dk, dv)`` in k's / v's layouts and dtypes; ``table [B, N, P, G]`` from
    :func:`inverse_table` (its last axis: the group)."""
    from jax.experimental.pallas import tpu as pltpu

    B, N, L, K, packed = dims(q, lse.shape[1])
    T, (P, G) = lse.shape[2], table.shape[-2:]          # T: the query tiles
    t = L // T

    def entry(b, h, p, g, tab):
        return tab[((b * N + h) * P + p) * G + g]

    q_specs = [tile_spec(t, K, lambda b, h, p, tab, g=g: (
        b, h, _query_tile(entry(b, h, p, g, tab)), 0), packed) for g in range(G)]
    rows = [row_spec(t, lambda b, h, p, tab, g=g: (
        b, h, _query_tile(entry(b, h, p, g, tab)), 0, 0)) for g in range(G)]
    kv_spec = tile_spec(t, K, lambda b, h, p, tab: (b, h, _key_tile(entry(b, h, p, 0, tab)),
                                                     0), packed)
    in_specs, args = q_specs + [kv_spec, kv_spec], [q] * G + [k, v]
    if keep is not None:
        in_specs.append(keep_spec(t, lambda b, h, p, tab: (
            b, _key_tile(entry(b, h, p, 0, tab)), 0, 0)))
        args.append(keep)
    grid = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(B, N, P),
        in_specs=in_specs + q_specs + rows + rows, out_specs=[kv_spec, kv_spec],
        scratch_shapes=[pltpu.VMEM((t, K), F32), pltpu.VMEM((t, K), F32)])
    return pl.pallas_call(
        functools.partial(_dkv_kernel, scale=float(scale), group=G, masked=keep is not None),
        grid_spec=grid,
        out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype),
                   jax.ShapeDtypeStruct(v.shape, v.dtype)],
        compiler_params=params(("parallel", "parallel", "arbitrary")),
        interpret=interpret, name="ditax_vsa_table_dkv",
    )(table.reshape(-1), *args, *[do] * G, *[lse] * G, *[delta] * G)


__all__ = ["MAX_TILES", "inverse_table", "table_dkv"]
