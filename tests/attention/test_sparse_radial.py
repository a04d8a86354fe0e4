"""Radial attention's block table (``attention.sparsity=radial``, issue 58): the paper's rule on
tiles (sink, dense band, windows halving as the tile-frame distance doubles, far frames
visited at a stride), density falling as the video grows longer, and the splash kernel with
the table equal to dense attention under the table's token mask."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ditax.attention.sparse.masks import (BlockTable, block_mask, density, element_mask,
                                          radial_blocks)
from ditax.attention.sparse.tiles import TileOrder


def test_one_query_row_follows_the_rule():
    """16 tile-frames of 2 x 2 tiles (S = 4): the row of the query tile (frame 15, tile 0),
    worked out by hand frame by frame."""
    order = TileOrder((16, 4, 4), (1, 2, 2))
    row = radial_blocks(order)[15 * 4].reshape(16, 4)      # [key frame, key tile]
    want = np.zeros((16, 4), bool)
    want[0] = True                                   # the sink
    want[14:16] = True                               # d <= 1: dense
    want[12:14, :2] = True                           # d = 2, 3: window 2 tiles (|ds| <= 1)
    want[8:12, 0] = True                             # d = 4..7: window 1 tile
    want[1:8:2, 0] = True                            # d = 8..14: window 1/2 -> every 2nd frame
    np.testing.assert_array_equal(row, want)
    sparser = radial_blocks(order, decay=0.5)
    assert (sparser <= radial_blocks(order)).all() and density(sparser) < density(
        radial_blocks(order))
    assert (sparser[:, :4].all() and np.diag(sparser).all())   # sink and own tile always


def test_density_falls_as_the_frames_grow():
    """Kept blocks grow as n log n, not n^2: the density falls with every doubling of the
    frames (a dense or fixed-frame-window rule would not), and a query tile keeps at most
    ``2 S log2 F`` key tiles (S = 4 tiles a frame, F frames): each doubling adds a band."""
    dens = []
    for frames in (4, 8, 16, 32, 64, 128):
        order = TileOrder((frames, 8, 8), (1, 4, 4))
        b = block_mask(order, "radial")
        dens.append(density(b))
        assert b.sum(1).mean() <= 2 * 4 * np.log2(frames), (frames, b.sum(1).mean())
    assert all(a > b for a, b in zip(dens, dens[1:])), dens
    assert dens[-1] < 0.12, dens


def _attend(q, k, v, mask):
    s = jnp.einsum("bqnk,blnk->bnql", q, k) / np.sqrt(q.shape[-1])
    s = jnp.where(mask[None, None], s, -jnp.inf)
    return jnp.einsum("bnql,blnk->bqnk", jax.nn.softmax(s, axis=-1), v)


@pytest.mark.parametrize("grid, tile, decay", [((8, 3, 64), (1, 2, 64), 1.0),
                                               ((8, 3, 64), (1, 2, 64), 0.5),
                                               ((7, 16, 14), (3, 16, 8), 1.0)])
def test_splash_with_the_radial_table_equals_the_masked_reference(grid, tile, decay, rng):
    """128-token tiles, 8 tile-frames of 2 tiles, the last frame's rows padded; and 384-token
    3 x 16 x 8 tiles (3 tile-frames of 2, frames and columns padded): interpreted splash with
    the radial table, one tile a kernel block, equals dense float32 attention under its token
    mask."""
    from ditax.attention.splash import splash_attention

    order = TileOrder(grid, tile)
    blocks = radial_blocks(order, decay)
    assert 0 < density(blocks) < 1
    L, b = int(np.prod(grid)), order.tile_len
    q, k, v = (jnp.asarray(rng.standard_normal((1, L, 2, 32)), jnp.float32) for _ in range(3))
    qt, kt, vt = (order.to_tiles(a) for a in (q, k, v))
    got = splash_attention(qt, kt, vt, kv_mask=jnp.asarray(order.valid)[None], block_q=b,
                           block_kv=b, block_table=BlockTable.of(order, blocks),
                           interpret=True)
    want = _attend(qt, kt, vt, jnp.asarray(element_mask(order, blocks)))
    rows = order.valid
    np.testing.assert_allclose(np.asarray(got)[:, rows], np.asarray(want)[:, rows], rtol=0,
                               atol=2e-5)
    dense = _attend(qt, kt, vt, jnp.asarray(element_mask(order, block_mask(order))))
    assert np.abs(np.asarray(dense)[:, rows] - np.asarray(got)[:, rows]).max() > 1e-3


def test_refusals():
    order = TileOrder((4, 4, 4), (1, 2, 2))
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="decay=.* must be a finite number > 0"):
            radial_blocks(order, bad)
