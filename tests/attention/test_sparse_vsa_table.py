"""VSA's fine pass on the table kernels (``attention.vsa_fine=table``, issue 58): the Pallas
kernels (interpreted on CPU) that read the picks as a scalar-prefetched table equal the jnp
gather path and the dense reference on fresh random inputs, forward and gradients, with
padded tiles and without; the transposed table the dk/dv kernel walks holds exactly the picks;
split calls (the SMEM budget) and a mesh (shard_map) equal one call; bf16 stays within its
rounding; forward and backward lower to Mosaic TPU at Wan 1.3B 480p (and, with libtpu,
compile for a v5e: slow tier); what cannot run is refused in one line. Each case runs with
several picked key tiles a grid step (``group``: 1, 2, 4, chosen; ``topk`` not a multiple of
it, the last step's padded slots skipped)."""

from __future__ import annotations

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ditax.attention.kernels.vsa_table import group_for, resolve_group
from ditax.attention.kernels.vsa_table_dkv import inverse_table
from ditax.attention.sparse import vsa_table
from ditax.attention.sparse.tiles import TileOrder
from ditax.attention.sparse.vsa import coarse, fine, vsa_attention, vsa_reference
from ditax.attention.sparse.vsa_table import TableFine, fine_table


def _inputs(rng, grid=(3, 3, 5), tile=(2, 2, 2), b=2, n=2, k=8):
    order = TileOrder(grid, tile)
    shape = (b, order.length, n, k)
    q, kk, v, g = (jnp.asarray(rng.standard_normal(shape), jnp.float32) for _ in range(4))
    mask = None if order.valid.all() else jnp.broadcast_to(jnp.asarray(order.valid),
                                                           (b, order.length))
    return order, q, kk, v, g, mask


def _value_and_grads(fn, cot):
    def loss(*a):
        return jnp.sum(fn(*a) * cot)
    return jax.jit(lambda *a: (fn(*a), jax.grad(loss, argnums=tuple(range(len(a))))(*a)))


ODD = (3, 2, 4)     # 24 tokens: a kernel block that is no power of two, a tile no cube


@pytest.mark.parametrize("grid, topk, kd, group, tile", [
    ((3, 3, 5), 3, 8, 1, (2, 2, 2)), ((2, 4, 4), 1, 8, 0, (2, 2, 2)),
    ((3, 3, 5), 2, 128, 0, (2, 2, 2)), ((3, 3, 5), 5, 8, 2, (2, 2, 2)),
    ((2, 4, 4), 3, 8, 2, (2, 2, 2)), ((3, 3, 5), 5, 128, 4, (2, 2, 2)),
    ((5, 3, 7), 3, 8, 0, ODD), ((5, 3, 7), 5, 128, 2, ODD), ((3, 4, 8), 2, 8, 1, ODD)])
def test_the_table_fine_stage_equals_the_gather(grid, topk, kd, group, tile, rng):
    """3 x 3 x 5 in 2 x 2 x 2 tiles: 12 tiles, the padded ones masked; 2 x 4 x 4: 4 whole
    tiles, no mask; K = 128: the kernels read ``[B, L, N·K]`` packed. ``group`` key tiles a
    grid step (0: chosen; 5 picks in steps of 2 or 4 and 3 in steps of 2: the last step
    padded). 3 x 2 x 4 tiles of 24 tokens: 5 x 3 x 7 in 8 padded tiles, 3 x 4 x 8 in 4 whole
    ones. The same picks into both; values and q / k / v gradients."""
    order, q, k, v, _, mask = _inputs(rng, grid=grid, tile=tile, k=kd)
    t = order.tile_len
    _, picks = coarse(q, k, v, t, topk, mask)
    cot = jnp.asarray(rng.standard_normal(q.shape), jnp.float32)
    got, g_got = _value_and_grads(
        lambda q, k, v: fine_table(q, k, v, picks, t, mask, interpret=True, group=group),
        cot)(q, k, v)
    want, g_want = _value_and_grads(lambda q, k, v: fine(q, k, v, picks, t, mask), cot)(q, k, v)
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=2e-5)
    for a, b in zip(g_got, g_want):
        assert np.abs(np.asarray(b)).max() > 0
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=2e-5)


def test_bfloat16_inputs_stay_close_to_the_float32_gather(rng):
    """bf16 q / k / v (P and dS cast to bf16 for the MXU products, float32 accumulation):
    within bf16's rounding of the float32 gather path on the same values; the gradients
    come back in bf16."""
    order, q, k, v, _, mask = _inputs(rng, k=128)
    t = order.tile_len
    _, picks = coarse(q, k, v, t, 2, mask)
    qb, kb, vb = (x.astype(jnp.bfloat16) for x in (q, k, v))
    cot = jnp.asarray(rng.standard_normal(q.shape), jnp.float32)
    got, g_got = _value_and_grads(
        lambda q, k, v: fine_table(q, k, v, picks, t, mask, interpret=True), cot)(qb, kb, vb)
    want, g_want = _value_and_grads(lambda q, k, v: fine(q, k, v, picks, t, mask), cot)(
        *(x.astype(jnp.float32) for x in (qb, kb, vb)))
    assert got.dtype == jnp.float32 and all(g.dtype == jnp.bfloat16 for g in g_got)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=1e-2)
    for a, b in zip(g_got, g_want):
        b = np.asarray(b)
        err = np.abs(np.asarray(a, np.float32) - b).max()
        assert err <= 3e-2 * np.abs(b).max(), err


@pytest.mark.parametrize("grid, tile", [((3, 3, 5), (2, 2, 2)), ((5, 3, 7), ODD)])
def test_vsa_on_the_table_equals_the_reference(grid, tile, rng):
    """The whole layer (coarse pass, picks, table fine pass, gate) against the dense masked
    reference: forward and the gradients of q, k, v and the gate (8-token cubes; 24-token
    3 x 2 x 4 tiles)."""
    order, q, k, v, g, mask = _inputs(rng, grid=grid, tile=tile, b=1, n=3)
    kw = dict(tile_len=order.tile_len, topk=2, kv_mask=mask)
    call = TableFine(interpret=True)
    cot = jnp.asarray(rng.standard_normal(q.shape), jnp.float32)
    got, g_got = _value_and_grads(lambda *a: vsa_attention(*a, **kw, call=call), cot)(q, k, v, g)
    want, g_want = _value_and_grads(lambda *a: vsa_reference(*a, **kw), cot)(q, k, v, g)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=2e-5)
    for a, b in zip(g_got, g_want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=2e-5)


def _decode(e):
    return e & 0x3FFF, (e >> 14) & 0x3FFF, (e >> 28) & 1, (e >> 29) & 1, (e >> 30) & 1


@pytest.mark.parametrize("group", [1, 3])
def test_the_inverse_table_holds_exactly_the_picks(group, rng):
    """Decoded, the dk/dv table's live slots are the picks' (key tile, query tile) pairs once
    each, ``group`` a step; a step's slots share its key tile, live slots first; each key
    tile's steps are one consecutive run opened by ``first`` and closed by ``last``; a key
    tile nobody picked has one dead step; the spare tail is dead; a dead slot repeats the
    query tile of the step before (no new DMA)."""
    B, N, T, topk, G = 2, 3, 7, 2, group
    scores = rng.standard_normal((B, N, T, T))
    scores[0, 0, :, :3] += 10.0                   # every query picks tiles 0..2: 3..6 unpicked
    picks = np.argsort(-scores, -1)[..., :topk].astype(np.int32)
    e = np.asarray(inverse_table(jnp.asarray(picks), group=G))
    P = T * topk // G + T
    assert e.shape == (B, N, P, G) and (e >= 0).all()
    kt, qi, live, first, last = _decode(e)
    assert (kt == kt[..., :1]).all() and (first == first[..., :1]).all()
    assert (last == last[..., :1]).all() and (np.diff(live, axis=-1) <= 0).all()
    kt, first, last = kt[..., 0], first[..., 0], last[..., 0]
    for b in range(B):
        for h in range(N):
            want = sorted((int(c), i) for i in range(T) for c in picks[b, h, i])
            got = [(int(kt[b, h, p]), int(qi[b, h, p, g])) for p in range(P) for g in range(G)
                   if live[b, h, p, g]]
            assert got == want                   # key tiles ascending, queries ascending
            assert (np.diff(kt[b, h]) >= 0).all()
            assert sorted(set(kt[b, h])) == list(range(T))   # every key tile gets a run
            starts = np.flatnonzero(np.r_[True, np.diff(kt[b, h]) != 0])
            ends = np.r_[starts[1:] - 1, P - 1]
            assert (np.flatnonzero(first[b, h]) == starts).all()
            assert (np.flatnonzero(last[b, h]) == ends).all()
            for c in range(T):                   # the fewest steps: ceil(picks / G), or one
                n = sum(p == c for p, _ in want)
                steps = (kt[b, h] == c).sum() if c < T - 1 else -(-n // G) or 1
                assert steps == max(1, -(-n // G))
            for p in range(1, P):
                dead = live[b, h, p] == 0
                assert (qi[b, h, p][dead] == qi[b, h, p - 1][dead]).all()
    assert live[0, 0].sum() == T * topk and set(kt[0, 0][live[0, 0].any(-1)]) == {0, 1, 2}
    assert (live.sum((-1, -2)) == T * topk).all()
    more = np.asarray(inverse_table(jnp.asarray(picks), 10, G))     # 7 query tiles of 10
    assert more.shape == (B, N, T * topk // G + 10, G)
    assert all(set(row & 0x3FFF) == set(range(10)) for row in more[..., 0].reshape(B * N, -1))
    assert (((more >> 28) & 1).sum((-1, -2)) == T * topk).all()


def test_packed_and_head_major_are_the_same_values(rng):
    """K = 128: the packed ``[B, L, N·K]`` blocks and the head-major ones visit the same
    tiles in the same order: equal values and gradients."""
    order, q, k, v, _, mask = _inputs(rng, b=1, n=2, k=128)
    t = order.tile_len
    _, picks = coarse(q, k, v, t, 2, mask)
    cot = jnp.asarray(rng.standard_normal(q.shape), jnp.float32)
    got, want = (_value_and_grads(
        lambda q, k, v, p=p: vsa_table._local(q, k, v, picks, mask, t, 0.1, True, packed=p),
        cot)(q, k, v) for p in (True, False))
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6)


def test_a_mesh_without_a_key_mask_equals_one_device(rng):
    """shard_map over fsdp 2 x tensor 2 (batch and heads split, the picks with them), whole
    tiles (no key mask): the values and gradients of one device."""
    from ditax.parallel.mesh import make_mesh

    order, q, k, v, _, mask = _inputs(rng, grid=(2, 4, 4), b=2, n=2)
    assert mask is None
    t = order.tile_len
    _, picks = coarse(q, k, v, t, 2)
    cot = jnp.asarray(rng.standard_normal(q.shape), jnp.float32)
    mesh = make_mesh(dict(data=1, fsdp=2, context=1, tensor=2), jax.devices()[:4])
    got, want = (_value_and_grads(
        lambda q, k, v, m=m: fine_table(q, k, v, picks, t, interpret=True, mesh=m), cot)(
            q, k, v) for m in (mesh, None))
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6)


@pytest.mark.parametrize("kd, n, budget, want", [(8, 3, 72, (2, 12)), (128, 2, 22, (1, 5))])
def test_calls_split_by_the_smem_budget_equal_one_call(kd, n, budget, want, rng, monkeypatch):
    """12 tiles, topk 2: one head's dk/dv table is 12 · 3 = 36 words. A 72-word budget runs
    two heads a call (3 heads: calls of 2 and 1, head-major); a 22-word one runs one head and
    5, 5, 2 query tiles a call (packed; each call's dk / dv its share): the values and the
    q / k / v gradients of one call."""
    order, q, k, v, _, mask = _inputs(rng, b=1, n=n, k=kd)
    t = order.tile_len
    _, picks = coarse(q, k, v, t, 2, mask)
    cot = jnp.asarray(rng.standard_normal(q.shape), jnp.float32)

    def run():                                  # one key tile a step: the words above
        return _value_and_grads(
            lambda q, k, v: fine_table(q, k, v, picks, t, mask, interpret=True, group=1),
            cot)(q, k, v)

    whole = run()
    monkeypatch.setattr(vsa_table, "SMEM_WORDS", budget)
    assert vsa_table.split(1, n, 12, 2) == want
    for a, b in zip(jax.tree.leaves(run()), jax.tree.leaves(whole)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6)
    monkeypatch.setattr(vsa_table, "SMEM_WORDS", 13)
    with pytest.raises(ValueError, match=r"one query tile's table \(1 samples x \(2 picks \+ "
                                         r"12 key tiles\)\) exceeds the 13-word SMEM budget"):
        fine_table(q, k, v, picks, t, mask, interpret=True)


def test_the_split_counts_the_grouped_tables(monkeypatch):
    """12 tiles, 5 picks in groups of 2: a head's forward table is 12 · 6 words (5 picks
    padded to 6), its dk/dv one 2 · (12 · 5 // 2 + 12) = 84 words: the larger decides the
    heads a call; past one head, the query tiles a call (7: 42 and 58 words)."""
    for budget, want in ((168, (2, 12)), (100, (1, 12)), (60, (1, 7))):
        monkeypatch.setattr(vsa_table, "SMEM_WORDS", budget)
        assert vsa_table.split(1, 3, 12, 5, 2) == want


@pytest.mark.parametrize("kd, group, tile, topk", [(128, 0, (4, 8, 8), 21),
                                                  (128, 1, (4, 8, 8), 21),
                                                  (64, 4, (4, 8, 8), 21),
                                                  (128, 0, (3, 32, 4), 11)])
def test_the_table_kernels_lower_for_tpu(kd, group, tile, topk):
    """Forward and backward (three kernels) lower to Mosaic TPU at Wan 1.3B 480p x 81 in
    4 x 8 x 8 tiles (168, 21 picked; bf16; nothing runs): K = 128 packed, K = 64
    head-major; the chosen group (7 tiles a step), one a step, and 4 (the last step
    padded); and in the least-padding 3 x 32 x 4 tiles (91 of 384 tokens, 11 picked)."""
    from jax import export

    from ditax.parallel.platform import target_platform

    order = TileOrder((21, 30, 52), tile)
    q = jax.ShapeDtypeStruct((1, order.length, 2, kd), jnp.bfloat16)
    mask = jnp.asarray(order.valid)[None]
    call = TableFine(interpret=False, group=group)

    def fwd(q, k, v, g):
        return vsa_attention(q, k, v, g, tile_len=order.tile_len, topk=topk, kv_mask=mask,
                             call=call)

    def grad(q, k, v, g):
        return jax.grad(lambda *a: fwd(*a).astype(jnp.float32).sum(), argnums=(0, 1, 2, 3))(
            q, k, v, g)

    with target_platform("tpu"):
        for fn, kernels in ((fwd, 1), (grad, 3)):
            text = export.export(jax.jit(fn), platforms=["tpu"])(q, q, q, q).mlir_module()
            assert text.count("tpu_custom_call") == kernels


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                    reason="libtpu is not installed (deviceless TPU compile)")
@pytest.mark.parametrize("tile, topk, group", [((4, 8, 8), 21, 7), ((3, 32, 4), 11, 4)])
def test_the_chosen_group_compiles_for_a_v5e(tile, topk, group):
    """Mosaic itself (libtpu, deviceless) compiles the forward and backward for a v5e at Wan
    1.3B 480p (12 heads x 128, bf16) within the scoped VMEM these kernels keep (v5e's 16 MiB
    default; ~40 s on a CPU): 21 of 168 4 x 8 x 8 tiles picked, 7 a step; 11 of 91
    least-padding 3 x 32 x 4 tiles (384 tokens: blocks no power of two), 4 a step."""
    from ditax.parallel.platform import target_platform
    from ditax.plan.targets import parse_target, topology_devices

    dev = topology_devices(parse_target("tpu-v5e-1"))[0]
    rep = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array([dev]), ("x",)),
                                     jax.sharding.PartitionSpec())
    order = TileOrder((21, 30, 52), tile)
    t, tiles = order.tile_len, int(np.prod(order.tiles))
    x = jax.ShapeDtypeStruct((1, order.length, 12, 128), jnp.bfloat16, sharding=rep)
    picks = jax.ShapeDtypeStruct((1, 12, tiles, topk), jnp.int32, sharding=rep)
    mask = jnp.asarray(order.valid)[None]
    assert group_for(topk, t, 128, 2) == group

    def grads(q, k, v, p):
        return jax.grad(lambda *a: fine_table(*a, p, t, mask, interpret=False).sum(),
                        argnums=(0, 1, 2))(q, k, v)

    with target_platform("tpu"):
        hlo = jax.jit(grads).lower(x, x, x, picks).compile().as_text()
    assert hlo.count('custom_call_target="tpu_custom_call"') == 3


def test_the_group_is_chosen_per_shape_and_checked():
    """At Wan 1.3B 480p (256-token tiles, K = 128, bf16) 21 / 42 / 84 picks take 3 / 6 / 11
    steps: groups of 7 / 7 / 8 (the fewest steps at most 8 a step, then the smallest group
    for them); a group past topk folds topk picks at once; a negative one, or one past the
    VMEM budget, is refused in one line."""
    assert [group_for(k, 256, 128, 2) for k in (21, 42, 84, 5, 1)] == [7, 7, 8, 5, 1]
    assert resolve_group(0, 21, 256, 128, 2) == 7 and resolve_group(1, 21, 256, 128, 2) == 1
    assert resolve_group(4, 3, 256, 128, 2) == 3
    with pytest.raises(ValueError, match=r"^attention.vsa_group=-1 must be an int >= 0"):
        resolve_group(-1, 21, 256, 128, 2)
    with pytest.raises(ValueError, match=r"^attention.vsa_group=16: 16 key tiles of 256 x 128 "
                                         r"a grid step take about 15.2 MiB of VMEM, over the "
                                         r"12 MiB budget; use attention.vsa_group<=11 or 0$"):
        resolve_group(16, 21, 256, 128, 2)


def test_what_cannot_run_is_refused(rng):
    from ditax.errors import AttentionUnavailable
    from ditax.parallel.platform import target_platform

    order, q, k, v, _, mask = _inputs(rng)
    _, picks = coarse(q, k, v, 8, 2, mask)
    with pytest.raises(ValueError, match="a 4-token tile is one kernel block and must be a "
                                         "multiple of 8 tokens"):
        fine_table(q, k, v, picks[:, :, :, :1], 4, None, interpret=True)
    with target_platform("cuda", (9, 0)), pytest.raises(AttentionUnavailable) as e:
        TableFine(interpret=False)(q, k, v, picks, 8, mask)
    assert "vsa_fine=table" in str(e.value) and "\n" not in str(e.value)
