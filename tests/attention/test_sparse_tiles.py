"""Tile-major token order and the sliding-tile block table (issue 58's first floor): exact round
trips on even and uneven grids, each tile one contiguous block, and attention through the
tile-major order with the block table's mask equal to attention in the transformer's own
order with the same token mask."""

from __future__ import annotations

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ditax.attention.sparse.masks import (block_mask, density, element_mask,
                                          sliding_tile_blocks, tile_coords)
from ditax.attention.sparse.tiles import (TileOrder, least_padding_tile, padded_length,
                                          padding_note)

CASES = [((4, 8, 8), (2, 4, 4)), ((5, 7, 9), (2, 4, 4)), ((3, 6, 10), (1, 2, 8)),
         ((1, 1, 1), (4, 8, 8)),
         # tiles that are neither cubes nor powers of two: 3 x 32 x 4 (384 tokens, Wan 480p's
         # least padding) on a grid cut on every axis, 3 x 2 x 4 (24)
         ((7, 30, 13), (3, 32, 4)), ((5, 7, 9), (3, 2, 4))]


@pytest.mark.parametrize("grid, tile", CASES)
def test_round_trip_is_exact_and_padding_is_zero(grid, tile, rng):
    order = TileOrder(grid, tile)
    L = int(np.prod(grid))
    x = jnp.asarray(rng.standard_normal((2, L, 3, 5)), jnp.float32)
    t = order.to_tiles(x)
    assert t.shape == (2, order.length, 3, 5)
    assert order.length % order.tile_len == 0 and order.valid.sum() == L
    np.testing.assert_array_equal(np.asarray(order.from_tiles(t)), np.asarray(x))
    assert not np.asarray(t)[:, ~order.valid].any()


@pytest.mark.parametrize("grid, tile", CASES)
def test_each_tile_is_one_contiguous_block(grid, tile):
    order = TileOrder(grid, tile)
    F, H, W = grid
    src = order.source.reshape(-1, order.tile_len)
    for (tf, ty, tx), tokens in zip(tile_coords(order), src):
        real = tokens[tokens >= 0]
        f, y, x = real // (H * W), real // W % H, real % W
        assert (f // tile[0] == tf).all() and (y // tile[1] == ty).all() and \
            (x // tile[2] == tx).all()
        inside = [(a, b, c) for a in range(tf * tile[0], min((tf + 1) * tile[0], F))
                  for b in range(ty * tile[1], min((ty + 1) * tile[1], H))
                  for c in range(tx * tile[2], min((tx + 1) * tile[2], W))]
        assert len(real) == len(inside)


def _attend(q, k, v, mask):
    s = jnp.einsum("bqnk,blnk->bnql", q, k) / np.sqrt(q.shape[-1])
    s = jnp.where(mask[None, None], s, -jnp.inf)
    return jnp.einsum("bnql,blnk->bqnk", jax.nn.softmax(s, axis=-1), v)


@pytest.mark.parametrize("grid, tile, window", [((4, 8, 8), (2, 4, 4), (1, 0, 1)),
                                                ((5, 7, 9), (2, 4, 4), (0, 1, 1)),
                                                ((7, 9, 9), (3, 2, 4), (1, 1, 0))])
def test_sliding_tile_attention_equals_the_token_masked_reference(grid, tile, window, rng):
    order = TileOrder(grid, tile)
    F, H, W = grid
    L = F * H * W
    q, k, v = (jnp.asarray(rng.standard_normal((1, L, 2, 8)), jnp.float32) for _ in range(3))
    blocks = sliding_tile_blocks(order, window)
    assert 0 < density(blocks) < 1
    got = order.from_tiles(_attend(*(order.to_tiles(a) for a in (q, k, v)),
                                   jnp.asarray(element_mask(order, blocks))))
    # the same rule on each token's own tile, in the transformer's frame-major order
    idx = np.arange(L)
    own = np.stack([idx // (H * W) // tile[0], idx // W % H // tile[1], idx % W // tile[2]], -1)
    token_mask = (np.abs(own[:, None] - own[None]) <= np.asarray(window)).all(-1)
    want = _attend(q, k, v, jnp.asarray(token_mask))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=2e-6)


def test_windows_and_refusals():
    order = TileOrder((8, 16, 16), (2, 4, 4))
    assert block_mask(order, "full").all()
    wide = sliding_tile_blocks(order, (3, 3, 3))
    assert wide.all() and density(sliding_tile_blocks(order, (0, 0, 0))) == 1 / 64
    assert density(sliding_tile_blocks(order, (1, 1, 1))) < density(
        sliding_tile_blocks(order, (2, 1, 1)))
    with pytest.raises(ValueError, match="window=.*three ints >= 0"):
        sliding_tile_blocks(order, (1, -1, 1))
    with pytest.raises(ValueError, match="sparsity=.radial2. is not one of full, sliding_tile"):
        block_mask(order, "radial2")
    with pytest.raises(ValueError, match=r"grid=\(4, 0, 8\) must be three positive ints"):
        TileOrder((4, 0, 8), (2, 4, 4))


@pytest.mark.parametrize("grid, tile, window", [
    ((4, 6, 16), (2, 4, 16), (1, 0, 1)),       # 128-token tiles; 6 rows: padded
    ((4, 6, 16), (2, 4, 16), (0, 1, 0)),
    ((5, 16, 20), (3, 16, 8), (0, 0, 1)),      # 384-token tiles (3 x 16 x 8), 2 x 1 x 3 of them
])
def test_splash_skips_the_masked_blocks_and_equals_the_reference(grid, tile, window, rng):
    """The splash kernel (interpreted) with the sliding-tile table, one tile a kernel block
    (kept or skipped whole; 128 tokens, and 384: no power of two), padding keys masked through
    kv_mask, equals dense attention with the table's token mask on every real query."""
    from ditax.attention.sparse.masks import BlockTable
    from ditax.attention.splash import splash_attention

    order = TileOrder(grid, tile)
    L, b = int(np.prod(grid)), order.tile_len
    q, k, v = (jnp.asarray(rng.standard_normal((1, L, 2, 64)), jnp.float32) for _ in range(3))
    blocks = sliding_tile_blocks(order, window)
    assert density(blocks) < 1
    qt, kt, vt = (order.to_tiles(a) for a in (q, k, v))
    valid = jnp.asarray(order.valid)[None]
    got = splash_attention(qt, kt, vt, kv_mask=valid, block_q=b, block_kv=b,
                           block_table=BlockTable.of(order, blocks), interpret=True)
    want = _attend(qt, kt, vt, jnp.asarray(element_mask(order, blocks)))
    rows = np.asarray(order.valid)
    np.testing.assert_allclose(np.asarray(got)[:, rows], np.asarray(want)[:, rows], rtol=0,
                               atol=2e-5)
    dense = splash_attention(qt, kt, vt, kv_mask=valid, block_q=b, block_kv=b, interpret=True)
    assert np.abs(np.asarray(dense)[:, rows] - np.asarray(got)[:, rows]).max() > 1e-3
    # the kernel's own block map: the table's skipped tiles are its empty blocks (0), the
    # kept ones whole (2), none partial
    from jax.experimental.pallas.ops.tpu import splash_attention as sa
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info

    from ditax.attention.splash_kernel import _table_mask

    table = BlockTable.of(order, blocks)
    info, _ = splash_attention_mask_info.process_mask(
        sa.MultiHeadMask([_table_mask((order.length, order.length), table)]), (b, b),
        shrink_grid=False)
    np.testing.assert_array_equal(np.asarray(info.block_mask)[0], np.where(blocks, 2, 0))


def test_splash_block_sparse_gradients_equal_the_reference(rng):
    """Backward through the block-sparse kernel (dq, dk, dv) equals the masked reference's."""
    from ditax.attention.sparse.masks import BlockTable
    from ditax.attention.splash import splash_attention

    order = TileOrder((2, 4, 64), (1, 2, 64))            # 128-token tiles, 4 of them
    blocks = sliding_tile_blocks(order, (0, 0, 0)) | sliding_tile_blocks(order, (1, 0, 0))
    table, mask = BlockTable.of(order, blocks), jnp.asarray(element_mask(order, blocks))
    q, k, v = (jnp.asarray(rng.standard_normal((1, order.length, 2, 64)), jnp.float32)
               for _ in range(3))
    w = jnp.asarray(rng.standard_normal(q.shape), jnp.float32)

    def loss(fn):
        return lambda q, k, v: jnp.sum(fn(q, k, v) * w)

    sparse = loss(lambda q, k, v: splash_attention(q, k, v, block_q=128, block_kv=128,
                                                   block_table=table, interpret=True))
    ref = loss(lambda q, k, v: _attend(q, k, v, mask))
    for got, want in zip(jax.grad(sparse, (0, 1, 2))(q, k, v), jax.grad(ref, (0, 1, 2))(q, k, v)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=5e-5)


@pytest.mark.parametrize("grid, tile, length", [
    ((21, 30, 52), (3, 32, 4), 34944),       # Wan 480p x 81: +6.7% (4 x 8 x 8: 43,008, +31%)
    ((21, 45, 80), (3, 16, 8), 80640),       # 720p x 81: +6.7% (4 x 8 x 8: 92,160, +22%)
    ((9, 30, 52), (3, 32, 4), 14976),        # 480p x 33
    ((21, 32, 32), (3, 16, 8), 21504),       # a grid of whole tiles: no padding
    ((1, 64, 64), (1, 16, 16), 4096),        # one frame: t = 1, a square h x w
])
def test_auto_tile_pads_least(grid, tile, length):
    """The chosen tile's padded length is the least of every tile of 128·k <= 1024 tokens
    (an independent brute force over all side lengths up to 1024), its size one of 256..512
    where such a tile ties, and among those the most cube-like."""
    assert least_padding_tile(grid) == tile
    assert padded_length(grid, tile) == length
    sides = np.arange(1, 1025)
    best = None
    for t in range(1, 1025):
        for h in range(1, 1024 // t + 1):
            w = sides[: 1024 // (t * h)]
            w = w[(t * h * w) % 128 == 0]
            if w.size:
                pad = [-(-g // s) * s for g, s in zip(grid[:2], (t, h))]
                n = pad[0] * pad[1] * (-(-grid[2] // w) * w)
                best = n.min() if best is None else min(best, n.min())
    assert best == length
    assert padded_length(grid, (4, 8, 8)) >= length


def test_padding_note_and_tiny_grids():
    assert padding_note((21, 30, 52), (3, 32, 4)) == (
        "21x30x52 in 3x32x4 tiles (384 tokens): 34,944 tokens for 32,760 (+6.7%)")
    assert padding_note((21, 30, 52), (4, 8, 8)).endswith("43,008 tokens for 32,760 (+31.3%)")
    t = least_padding_tile((2, 3, 5))            # smaller than any 128-token tile: one tile
    assert np.prod(t) == 128 and padded_length((2, 3, 5), t) == 128
    assert least_padding_tile((21, 30, 52), most=256) == (1, 32, 4)   # only 128 tokens pad as little
    with pytest.raises(ValueError, match=r"grid=\(0, 3, 5\) must be three positive ints"):
        least_padding_tile((0, 3, 5))


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                    reason="libtpu is not installed (deviceless TPU compile)")
def test_384_token_tiles_compile_for_a_v5e():
    """Mosaic (libtpu, deviceless) compiles splash's and flash's block-sparse forward and
    backward for a v5e with the sliding-tile table of Wan 1.3B 480p x 81 in its least-padding
    3 x 32 x 4 tiles (384-token blocks: no power of two; 12 heads x 128, bf16; ~10 s)."""
    from ditax.attention.flash import flash_attention
    from ditax.attention.sparse.masks import BlockTable
    from ditax.attention.splash import splash_attention
    from ditax.parallel.platform import target_platform
    from ditax.plan.targets import parse_target, topology_devices

    dev = topology_devices(parse_target("tpu-v5e-1"))[0]
    rep = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array([dev]), ("x",)),
                                     jax.sharding.PartitionSpec())
    order = TileOrder((21, 30, 52), least_padding_tile((21, 30, 52)))
    assert order.tile == (3, 32, 4) and order.length == 34944
    table = BlockTable.of(order, sliding_tile_blocks(order, (1, 1, 1)))
    x = jax.ShapeDtypeStruct((1, order.length, 12, 128), jnp.bfloat16, sharding=rep)
    mask, t = jnp.asarray(order.valid)[None], order.tile_len
    for kernel in (splash_attention, flash_attention):
        def grads(q, k, v, kernel=kernel):
            def loss(*a):
                return kernel(*a, kv_mask=mask, block_q=t, block_kv=t, block_table=table,
                              interpret=False).astype(jnp.float32).sum()
            return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

        with target_platform("tpu"):
            hlo = jax.jit(grads).lower(x, x, x).compile().as_text()
        assert hlo.count('custom_call_target="tpu_custom_call"') == 3, kernel.__name__
