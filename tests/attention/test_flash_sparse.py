"""Block-sparse ``flash`` (issue 58): ditax's Pallas flash kernels with a block table visit only
the live key blocks of each query block (forward, dq) and the live query blocks of each key
block (dk/dv), through scalar-prefetched block lists; forward and gradients equal dense float32
attention under the table's token mask (interpreted), token-major and head-major, padded keys
masked; backward blocks other than the forward's; the listed grid is narrower than the dense
one; blocks that straddle tiles are refused."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ditax.attention.flash import flash_attention
from ditax.attention.kernels.flash_sparse import block_lists
from ditax.attention.sparse.masks import (BlockTable, density, element_mask, radial_blocks,
                                          sliding_tile_blocks)
from ditax.attention.sparse.tiles import TileOrder

ORDER = TileOrder((8, 3, 8), (1, 2, 8))      # 16-token tiles, 8 x 2 x 1 of them, rows padded
# 24-token 3 x 2 x 4 tiles (no power of two, no cube), 3 x 2 x 2 of them, padded on each axis
ODD = TileOrder((7, 3, 7), (3, 2, 4))
TABLES = {"radial": lambda o: radial_blocks(o, 0.5),
          "sliding_tile": lambda o: sliding_tile_blocks(o, (1, 0, 0))}


def _reference(mask):
    def attend(q, k, v):
        s = jnp.einsum("bqnk,blnk->bnql", q, k) / np.sqrt(q.shape[-1])
        s = jnp.where(mask[None, None], s, -jnp.inf)
        return jnp.einsum("bnql,blnk->bqnk", jax.nn.softmax(s, axis=-1), v)
    return attend


def _inputs(rng, order, heads=2, dim=32):
    L = int(np.prod(order.grid))
    return [order.to_tiles(jnp.asarray(rng.standard_normal((1, L, heads, dim)), jnp.float32))
            for _ in range(3)]


@pytest.mark.parametrize("kind, head_major, bwd, order", [("radial", False, None, ORDER),
                                                          ("sliding_tile", True, None, ORDER),
                                                          ("radial", False, 8, ORDER),
                                                          ("sliding_tile", False, None, ODD),
                                                          ("radial", True, 8, ODD)])
def test_forward_and_gradients_equal_the_masked_reference(kind, head_major, bwd, order, rng):
    blocks = TABLES[kind](order)
    assert 0 < density(blocks) < 1
    table = BlockTable.of(order, blocks)
    q, k, v = _inputs(rng, order)
    valid = jnp.asarray(order.valid)
    ref = _reference(jnp.asarray(element_mask(order, blocks)))
    hm = (lambda x: jnp.swapaxes(x, 1, 2)) if head_major else (lambda x: x)  # noqa: E731
    b = order.tile_len

    def sparse(q, k, v):
        return hm(flash_attention(hm(q), hm(k), hm(v), kv_mask=valid[None], block_q=b,
                                  block_kv=b, block_q_bwd=bwd, block_kv_bwd=bwd,
                                  block_table=table, interpret=True, head_major=head_major))

    rows = order.valid
    np.testing.assert_allclose(np.asarray(sparse(q, k, v))[:, rows],
                               np.asarray(ref(q, k, v))[:, rows], rtol=0, atol=2e-5)
    w = jnp.asarray(rng.standard_normal(q.shape), jnp.float32) * valid[None, :, None, None]
    got = jax.grad(lambda *a: jnp.sum(sparse(*a) * w), (0, 1, 2))(q, k, v)
    want = jax.grad(lambda *a: jnp.sum(ref(*a) * w), (0, 1, 2))(q, k, v)
    for g, r in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=0, atol=2e-5)
    dense = flash_attention(q, k, v, kv_mask=valid[None], block_q=b, block_kv=b,
                            interpret=True)
    assert np.abs(np.asarray(dense)[:, rows] - np.asarray(ref(q, k, v))[:, rows]).max() > 1e-3


def _grids(fn, *args):
    """The grids of the pallas_calls in ``fn``'s jaxpr (forward and backward)."""
    out = []

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "pallas_call":
                out.append(tuple(eqn.params["grid_mapping"].grid))
                continue
            for p in eqn.params.values():
                for sub in (p if isinstance(p, (tuple, list)) else (p,)):
                    sub = getattr(sub, "jaxpr", sub)
                    if hasattr(sub, "eqns"):
                        walk(sub)
    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return out


def test_the_kernels_walk_only_the_listed_blocks(rng):
    """The lists hold exactly the table's live blocks (backward blocks of 8 queries: each key
    tile's count twice); each kernel's innermost grid axis is its longest list, the forward's
    and dq's shorter than the dense walk."""
    order = TileOrder((16, 2, 8), (1, 2, 8))                  # 16 tiles of 16 tokens
    blocks = radial_blocks(order, 0.5)
    table = BlockTable.of(order, blocks)
    ids, counts, width = block_lists(table, order.length, order.length, 16, 16)
    np.testing.assert_array_equal(counts, blocks.sum(1))
    for r in range(16):
        np.testing.assert_array_equal(np.sort(ids.reshape(16, width)[r, :counts[r]]),
                                      np.nonzero(blocks[r])[0])
    _, counts_t, width_t = block_lists(table, order.length, order.length, 8, 16, transpose=True)
    np.testing.assert_array_equal(counts_t, np.repeat(blocks.sum(0), 2))
    q, k, v = _inputs(rng, order, heads=1, dim=8)

    def loss(q, k, v):
        return jnp.sum(flash_attention(q, k, v, block_q=16, block_kv=16, block_table=table,
                                       interpret=True))
    grids = _grids(jax.grad(loss, (0, 1, 2)), q, k, v)
    # forward and dq: the longest query row (< 16 key blocks); dk/dv: the longest key column
    # (the sink's: every query attends it)
    assert sorted(g[-1] for g in grids) == [width, width, width_t] == [
        blocks.sum(1).max(), blocks.sum(1).max(), blocks.sum(0).max()], grids
    assert width < 16


def test_blocks_across_tiles_are_refused(rng):
    table = BlockTable.of(ORDER, TABLES["radial"](ORDER))
    q, k, v = _inputs(rng, ORDER)
    with pytest.raises(ValueError, match="a query block of 32 tokens is not inside one "
                                         "16-token tile"):
        flash_attention(q, k, v, block_q=32, block_kv=16, block_table=table, interpret=True)


def test_the_listed_kernels_lower_for_tpu():
    """Forward and backward with a radial table over 256-token tiles lower to Mosaic TPU at a
    Wan 480p x 81 length (nothing runs; jax.export lowers for the platform)."""
    from jax import export

    order = TileOrder((21, 30, 52), (4, 8, 8))
    table = BlockTable.of(order, radial_blocks(order, 0.5))
    q = jax.ShapeDtypeStruct((1, order.length, 2, 128), jnp.bfloat16)

    def fwd(q, k, v):
        return flash_attention(q, k, v, block_q=256, block_kv=256, block_table=table,
                               interpret=False)

    def grad(q, k, v):
        return jax.grad(lambda *a: fwd(*a).astype(jnp.float32).sum(), argnums=(0, 1, 2))(q, k, v)

    for fn in (fwd, grad):
        text = export.export(jax.jit(fn), platforms=["tpu"])(q, q, q).mlir_module()
        assert "tpu_custom_call" in text
