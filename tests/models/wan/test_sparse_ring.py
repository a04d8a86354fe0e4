"""Block-sparse self-attention on a ring (issue 58 item 1 and 2: ``ring`` and ``ulysses_ring``
shard whole tiles; each ring step's local kernel reads the block-table slice of (its query
group, the visiting key group) and skips what the slice masks, a step whose slice masks
everything runs no kernel). Kernel level: a ring over a table equals dense attention under
the table's token mask (values; flash also q / k / v gradients). Model level: a small Wan on
fsdp 2 x context 4 (a pure ring and a 2 x 2 ulysses_ring) equals the one-device sparse
model, forward and the weights' gradients."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ditax.attention.options import SequenceOptions, UlyssesRingOptions
from ditax.attention.sequence import plan_sequence_parallel, run_sequence_parallel
from ditax.attention.sparse.masks import BlockTable, block_mask, element_mask
from ditax.attention.sparse.tiles import TileOrder
from ditax.config import AttentionConfig, ConfigError, ModelConfig
from ditax.models.wan.build import init_model
from ditax.parallel import make_mesh


def _masked_reference(q, k, v, mask):
    s = jnp.einsum("bqnk,blnk->bnql", q, k) / np.sqrt(q.shape[-1])
    s = jnp.where(mask[None, None], s, -jnp.inf)
    return jnp.einsum("bnql,blnk->bqnk", jax.nn.softmax(s, axis=-1), v)


def _plan(backend, mesh, shape, local, table, block):
    cls = UlyssesRingOptions if backend == "ulysses_ring" else SequenceOptions
    extra = {"ulysses_shards": 2} if backend == "ulysses_ring" else {}
    options = cls(local=local, block_q=block, block_kv=block,
                  local_options=(("block_table", table),), **extra)
    return plan_sequence_parallel(backend, mesh, q_shape=shape, options=options)


# 8 x 2 x 1 = 16 tiles of 64 tokens (rows padded: key masks), or 8 tiles of 128 (splash
# blocks = tiles: whole blocks skipped)
# (the flash cases, with gradients, 12-27 s each on two cores: the slow tier; the Wan ring
# forward below keeps a flash ring with a table in make test)
_SLOW = pytest.mark.slow
CASES = [pytest.param("ring", "flash", "sliding_tile", (8, 3, 32), (1, 2, 32), 64,
                      marks=_SLOW),
         pytest.param("ring", "flash", "radial", (8, 3, 32), (1, 2, 32), 64, marks=_SLOW),
         pytest.param("ulysses_ring", "flash", "radial", (8, 3, 32), (1, 2, 32), 64,
                      marks=_SLOW),
         ("ring", "splash", "sliding_tile", (8, 4, 32), (1, 4, 32), 128),
         ("ulysses_ring", "splash", "radial", (8, 4, 32), (1, 4, 32), 128),
         pytest.param("ring", "flash", "full", (8, 3, 32), (1, 2, 32), 64, marks=_SLOW)]


@pytest.mark.parametrize("backend, local, sparsity, grid, tile, block", CASES)
def test_ring_with_a_table_equals_masked_dense(backend, local, sparsity, grid, tile, block,
                                               rng):
    order = TileOrder(grid, tile)
    blocks = block_mask(order, sparsity, (1, 0, 0), 0.5)
    table = BlockTable.of(order, blocks)
    L = order.length
    q, k, v = (jnp.asarray(rng.standard_normal((2, L, 4, 16)).astype(np.float32))
               for _ in range(3))
    valid = jnp.broadcast_to(jnp.asarray(order.valid), (2, L))
    mask = element_mask(order, blocks)
    mesh = make_mesh({"fsdp": 2, "context": 4})
    plan = _plan(backend, mesh, q.shape, local, table, block)
    assert plan.ring_tables is not None and plan.ring > 1
    assert "ring steps skip the kernel" in plan.describe()
    if sparsity == "sliding_tile":     # far groups: whole steps without a kernel
        assert plan.ring_tables.skipped > 0, plan.describe()
    elif sparsity == "full":           # one slice, every step: no switch
        assert len(plan.ring_tables.tables) == 1 and not plan.ring_tables.skipped
    else:                              # radial's sink keeps group 0 in every step
        assert not any(t.table.all() for t in plan.ring_tables.tables[1:])
    got = run_sequence_parallel(plan, q, k, v, kv_mask=None if order.valid.all() else valid)
    want = _masked_reference(q, k, v, mask)
    scale = float(jnp.abs(want).max())
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=2e-5 * scale)
    dense = _masked_reference(q, k, v, np.broadcast_to(order.valid, mask.shape))
    if sparsity != "full":
        assert float(jnp.abs(got - dense).max()) > 1e-2            # blocks were masked
    if local != "flash":          # splash's log-sum-exp (a ring step's) is forward-only
        return
    w = jnp.asarray(rng.standard_normal(q.shape).astype(np.float32))
    kv_mask = None if order.valid.all() else valid

    def loss(fn):
        return lambda q, k, v: jnp.sum(fn(q, k, v) * w)

    g_got = jax.grad(loss(lambda q, k, v: run_sequence_parallel(plan, q, k, v,
                                                                kv_mask=kv_mask)),
                     (0, 1, 2))(q, k, v)
    g_want = jax.grad(loss(lambda q, k, v: _masked_reference(q, k, v, mask)), (0, 1, 2))(q, k, v)
    for a, b in zip(g_got, g_want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0,
                                   atol=2e-5 * float(jnp.abs(b).max()))


def test_the_slices_cut_the_table_at_the_group_bounds():
    """Slice (r, j) is rows of group r by columns of group j; equal slices are shared and a
    slice that keeps nothing is -1."""
    from ditax.attention.sequence.sparse_ring import RingTables

    order = TileOrder((8, 1, 1), (1, 1, 1))
    blocks = block_mask(order, "sliding_tile", (1, 0, 0))        # tridiagonal over 8 tiles
    cut = RingTables.of(BlockTable.of(order, blocks), 4)
    assert cut.index[0][2] == cut.index[0][3] == cut.index[3][0] == -1
    assert cut.index[0][0] == cut.index[1][1] == cut.index[3][3]  # the same 2 x 2 block
    assert cut.skipped == 16 - 4 - 6
    for r in range(4):
        for j in range(4):
            i = cut.index[r][j]
            part = blocks[2 * r:2 * r + 2, 2 * j:2 * j + 2]
            np.testing.assert_array_equal(cut.tables[i].table if i >= 0 else
                                          np.zeros((2, 2), bool), part)
    with pytest.raises(ValueError, match="8 tiles cannot be cut into 3 ring groups"):
        RingTables.of(BlockTable.of(order, blocks), 3)


def test_a_table_that_does_not_fit_the_shards_is_refused():
    order = TileOrder((6, 4, 32), (1, 4, 32))                      # 6 tiles on 4 shards
    table = BlockTable.of(order, block_mask(order, "full"))
    with pytest.raises(ValueError, match="whole tiles on each of the 4 context shards"):
        _plan("ring", make_mesh({"fsdp": 2, "context": 4}), (2, order.length, 4, 16),
              "flash", table, 128)


CFG = ModelConfig(num_attention_heads=4, attention_head_dim=16, ffn_dim=48, num_layers=2,
                  in_channels=4, out_channels=4, text_dim=24, freq_dim=16)


def _inputs(rng, f, y, x, b=2):
    return (rng.standard_normal((b, 4, f, y, x)).astype(np.float32),
            rng.uniform(0, 1000, size=(b,)).astype(np.float32),
            rng.standard_normal((b, 7, 24)).astype(np.float32))


def _grads(model, lat, t, text, w):
    """The weights' gradients, every layer's attention backward in them."""
    from flax import nnx

    g = nnx.grad(lambda m: jnp.sum(m(lat, t, text) * w))(model)
    return [np.asarray(x) for x in jax.tree.leaves(nnx.state(g))]


# Grid 8 x 7 x 16 (rows padded to 8) in 1 x 4 x 8 tiles of 32 tokens: 8 x 2 x 2 = 32 tiles,
# 8 a context shard; flash blocks: one tile (set: off a TPU the plan's default is 128)
SLIDING = dict(sparsity="sliding_tile", tile=(1, 4, 8), window=(3, 1, 1), block_q=32,
               block_kv=32)
RADIAL = dict(sparsity="radial", tile=(1, 4, 8), decay=0.5, block_q=32, block_kv=32)


@pytest.mark.parametrize("backend, sparse, grads", [    # with gradients: 35-44 s each
    pytest.param("ring", SLIDING, True, marks=pytest.mark.slow),
    pytest.param("ulysses_ring", RADIAL, True, marks=pytest.mark.slow),
    pytest.param("ring", RADIAL, False, marks=pytest.mark.slow),   # 17 s
])
def test_wan_on_a_ring_equals_one_device(backend, sparse, grads, rng):
    lat, t, text = _inputs(rng, 8, 14, 32)
    one = init_model(CFG, AttentionConfig(backend="flash", **sparse), seed=5)
    mesh = make_mesh({"fsdp": 2, "context": 4})
    extra = {"ulysses_shards": 2} if backend == "ulysses_ring" else {}
    ring = init_model(CFG, AttentionConfig(backend=backend, local="flash", **sparse, **extra),
                      mesh=mesh, seed=5)
    h, ctx = ring.embed(lat, t, text)
    call = ctx.plan(ring.attention_plan).self_attn
    assert dict(call.options.local_options)["block_table"] == ctx.tiles.table
    want = np.asarray(one(lat, t, text))
    got = np.asarray(ring(lat, t, text))
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max())
    dense = np.asarray(init_model(CFG, AttentionConfig(backend="xla"), seed=5)(lat, t, text))
    assert np.abs(got - dense).max() > 1e-3                       # blocks were skipped
    if not grads:
        return
    w = jnp.asarray(rng.standard_normal(lat.shape).astype(np.float32))
    g_got, g_want = _grads(ring, lat, t, text, w), _grads(one, lat, t, text, w)
    assert len(g_got) == len(g_want) > 10
    for a, b in zip(g_got, g_want):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5 * max(np.abs(b).max(), 1e-3))


@pytest.mark.slow   # 9 s
def test_wan_on_a_splash_ring_equals_one_device(rng):
    """splash as the ring's local kernel (forward: its log-sum-exp has no VJP), 128-token
    tiles: 8 x 2 x 1 tiles of 1 x 4 x 32, two a context shard."""
    sparse = dict(sparsity="sliding_tile", tile=(1, 4, 32), window=(3, 1, 1))
    lat, t, text = _inputs(rng, 8, 14, 64)
    want = np.asarray(init_model(CFG, AttentionConfig(backend="splash", **sparse), seed=5)(
        lat, t, text))
    ring = init_model(CFG, AttentionConfig(backend="ring", local="splash", **sparse),
                      mesh=make_mesh({"fsdp": 2, "context": 4}), seed=5)
    got = np.asarray(ring(lat, t, text))
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max())


@pytest.mark.parametrize("backend, mesh, sparse, frames, grads", [
    pytest.param("ring", {"context": 8}, SLIDING, 3, True,    # 3 x 2 x 2 = 12 tiles -> 16
                 marks=pytest.mark.slow),                     # (28 s)
    pytest.param("ulysses", {"fsdp": 2, "context": 4}, RADIAL, 5, False,   # 20 (divides)
                 marks=pytest.mark.slow),                     # (8 s)
    pytest.param("ulysses_ring", {"context": 8}, RADIAL, 5, False,   # 20 -> 24 (R 4 x U 2)
                 marks=pytest.mark.slow),
])
def test_a_tile_count_off_the_shards_is_padded_with_whole_tiles(backend, mesh, sparse,
                                                                  frames, grads, rng):
    """Whole masked tile-frames are appended until the tile count divides the context
    shards; the model equals the one-device model (which pads nothing), forward and (ring)
    the weights' gradients."""
    from ditax.attention.sparse.layout import sparse_layout

    lat, t, text = _inputs(rng, frames, 14, 32)
    one_device = init_model(CFG, AttentionConfig(backend="flash", **sparse), seed=5)
    want = np.asarray(one_device(lat, t, text))
    mesh = make_mesh(mesh)
    extra = {"ulysses_shards": 2} if backend == "ulysses_ring" else {}
    acfg = AttentionConfig(backend=backend, local="flash", **sparse, **extra)
    model = init_model(CFG, acfg, mesh=mesh, seed=5)
    h, ctx = model.embed(lat, t, text)
    shards = mesh.shape["context"]
    n = int(np.prod(ctx.tiles.order.tiles))
    assert n % shards == 0 and n == -(-frames * 4 // shards) * shards
    one = sparse_layout(acfg, (frames, 7, 16))
    real = int(np.prod(one.order.tiles))              # real tiles first, their blocks kept
    np.testing.assert_array_equal(ctx.tiles.table.table[:real, :real], one.table.table)
    assert not ctx.tiles.table.table[:real, real:].any()
    np.testing.assert_array_equal(ctx.tiles.table.table[real:, real:],
                                  np.eye(n - real, dtype=bool))
    got = np.asarray(model(lat, t, text))
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max())
    if grads:
        w = jnp.asarray(rng.standard_normal(lat.shape).astype(np.float32))
        for a, b in zip(_grads(model, lat, t, text, w), _grads(one_device, lat, t, text, w)):
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5 * max(np.abs(b).max(), 1e-3))


def test_what_the_ring_does_not_honour_is_refused(rng):
    model = init_model(CFG, AttentionConfig(backend="ring", local="xla", **SLIDING),
                       mesh=make_mesh({"fsdp": 2, "context": 4}), seed=5)
    with pytest.raises(ConfigError, match="backend=ring needs attention.local=splash or flash"):
        model(*_inputs(rng, 8, 14, 32))


def test_the_config_takes_a_ring_with_a_sparsity():
    from ditax.config import load_config, validate

    for backend in ("ring", "ulysses_ring"):
        validate(load_config("tiny", [f"attention.backend={backend}", "attention.local=flash",
                                      "attention.sparsity=radial", "mesh.context=2"]),
                 num_devices=8)


def test_a_ring_step_with_a_table_lowers_for_tpu():
    """flash continuing a previous partial over a table's slice (a ring step: the carried
    output and lse aliased past the two prefetched block lists), forward and backward, lowers
    to Mosaic TPU (nothing runs; jax.export lowers for the platform)."""
    from jax import export

    from ditax.attention.flash import flash_attention
    from ditax.attention.sequence.sparse_ring import RingTables

    order = TileOrder((8, 16, 16), (1, 16, 16))                    # 8 tiles of 256 tokens
    cut = RingTables.of(BlockTable.of(order, block_mask(order, "radial", decay=0.5)), 2)
    table = cut.tables[cut.index[1][0]]
    x = jax.ShapeDtypeStruct((1, order.length // 2, 2, 128), jnp.bfloat16)
    o = jax.ShapeDtypeStruct(x.shape, jnp.float32)
    lse = jax.ShapeDtypeStruct((1, 2, order.length // 2), jnp.float32)

    def fwd(q, k, v, o, lse):
        return flash_attention(q, k, v, block_q=256, block_kv=256, block_table=table,
                               o_prev=o, lse_prev=lse, return_lse=True, interpret=False)

    def grad(q, k, v, o, lse):
        return jax.grad(lambda *a: fwd(*a)[0].sum(), argnums=(0, 1, 2, 3))(q, k, v, o, lse)

    for fn in (fwd, grad):
        text = export.export(jax.jit(fn), platforms=["tpu"])(x, x, x, o, lse).mlir_module()
        assert "tpu_custom_call" in text


def test_the_plan_summary_counts_the_shards_padding_tiles():
    """``ditax plan``'s sparsity entry on 8 context shards: 12 tiles of 32 tokens padded to
    16 (the layout the model runs), one block each for the 4 padding tiles."""
    from ditax.attention.sparse.layout import layout_summary

    acfg = AttentionConfig(backend="ring", local="flash", **SLIDING)
    one, eight = layout_summary(acfg, (3, 7, 16)), layout_summary(acfg, (3, 7, 16), shards=8)
    assert (one["padded_tokens"], eight["padded_tokens"]) == (12 * 32, 16 * 32)
    assert eight["tokens"] == one["tokens"] == 3 * 7 * 16
    kept = one["density"] * 12 ** 2 + 4                        # the real blocks, 4 diagonal
    assert eight["density"] == pytest.approx(kept / 16 ** 2)


def test_ditax_plan_takes_a_sparse_ring_and_counts_its_padding(capsys):
    """``ditax plan`` (no compile) of Wan 1.3B 480p x 81 on a ring of 4: the config is taken
    and the layout is the one the model runs (91 tiles of 3x32x4 padded to 104)."""
    from ditax.cli import main

    assert main(["plan", "wan2.1-t2v-1.3b", "--target", "cpu:4", "attention.backend=ring",
                 "attention.local=flash", "attention.sparsity=sliding_tile",
                 "attention.tile=auto", "mesh.context=4"]) == 0
    lines = [s for s in capsys.readouterr().out.splitlines() if s.startswith("sparsity")]
    assert len(lines) == 1 and "39,936 tokens for 32,760" in lines[0], lines


@pytest.mark.slow   # 15 s: traces a ring's gradient
def test_training_a_splash_ring_is_refused_in_one_line(rng):
    """splash's log-sum-exp (what a ring step merges) has no VJP: the gradient of a ring
    around splash raises naming the fix, not jax's "Higher-order AD not supported"."""
    from ditax.errors import AttentionUnavailable

    order = TileOrder((8, 4, 32), (1, 4, 32))
    table = BlockTable.of(order, block_mask(order, "sliding_tile", (1, 0, 0)))
    q = jnp.asarray(rng.standard_normal((2, order.length, 4, 16)).astype(np.float32))
    plan = _plan("ring", make_mesh({"fsdp": 2, "context": 4}), q.shape, "splash", table, 128)
    with pytest.raises(AttentionUnavailable) as e:
        jax.grad(lambda q: run_sequence_parallel(plan, q, q, q).sum())(q)
    assert "train a ring with local='flash'" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.skipif(__import__("importlib").util.find_spec("libtpu") is None,
                    reason="libtpu is not installed (deviceless TPU compile)")
@pytest.mark.slow   # 7 s: a deviceless compile
def test_a_sparse_ring_compiles_for_a_v6e_without_one():
    """The sparse ring (flash, bf16, fsdp 2 x context 4 of a v6e-8 topology from libtpu, no
    TPU attached): forward and gradients compile with the Mosaic kernels of each distinct
    slice in every switch (3 slices, 6 of the 16 steps without a kernel); the gradient holds
    the forward, dq and dk/dv kernels of each."""
    import ditax
    from jax.sharding import NamedSharding, PartitionSpec as P

    from ditax.plan.audit import audit
    from ditax.plan.targets import parse_target, topology_devices

    mesh = make_mesh({"fsdp": 2, "context": 4}, topology_devices(parse_target("tpu-v6e-8")))
    order = TileOrder((8, 16, 16), (1, 16, 16))                    # 8 tiles of 256 tokens
    table = BlockTable.of(order, block_mask(order, "sliding_tile", (1, 0, 0)))
    x = jax.ShapeDtypeStruct((2, order.length, 8, 128), jnp.bfloat16,
                             sharding=NamedSharding(mesh, P("fsdp")))
    with ditax.target_platform("tpu", device_kind="TPU v6 lite"):
        plan = plan_sequence_parallel("ring", mesh, q_shape=x.shape, dtype=jnp.bfloat16,
                                      options=SequenceOptions(
                                          local="flash", block_q=256, block_kv=256,
                                          local_options=(("block_table", table),)))
        assert (len(plan.ring_tables.tables), plan.ring_tables.skipped) == (3, 6)

        def fwd(q, k, v):
            return run_sequence_parallel(plan, q, k, v)

        def grad(q, k, v):
            return jax.grad(lambda *a: fwd(*a).astype(jnp.float32).sum(), (0, 1, 2))(q, k, v)

        calls = [audit(jax.jit(fn).lower(x, x, x).compile().as_text())["tpu_custom_calls"]
                 for fn in (fwd, grad)]
    assert calls[0] > 0 and calls[0] % 3 == 0 and calls[1] == 3 * calls[0], calls
