"""VSA (``attention.sparsity=vsa``, issue 58 item 3): the gather fast path equals the dense
masked reference on fresh random inputs, forward and gradients (q, k, v and the gate),
float32, with padded tiles; with every tile picked and no gate it is dense attention."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ditax.attention.reference import reference_attention
from ditax.attention.sparse.tiles import TileOrder
from ditax.attention.sparse.vsa import coarse, vsa_attention, vsa_density, vsa_reference


def _inputs(rng, grid=(3, 3, 5), tile=(2, 2, 2), b=2, n=2, k=8):
    order = TileOrder(grid, tile)
    shape = (b, order.length, n, k)
    q, kk, v, g = (jnp.asarray(rng.standard_normal(shape), jnp.float32) for _ in range(4))
    mask = jnp.broadcast_to(jnp.asarray(order.valid), (b, order.length))
    return order, q, kk, v, g, mask


@pytest.mark.parametrize("topk, tile", [(1, (2, 2, 2)), (3, (2, 2, 2)), (3, (3, 1, 4))])
def test_fast_path_equals_the_reference_forward_and_backward(topk, tile, rng):
    """2 x 2 x 2 tiles: 2 x 2 x 3 = 12 tiles, padded; 3 x 1 x 4 (12 tokens, no cube, no power
    of two): 1 x 3 x 2 = 6 tiles, padded."""
    order, q, k, v, g, mask = _inputs(rng, tile=tile)
    kw = dict(tile_len=order.tile_len, topk=topk, kv_mask=mask)
    cot = jnp.asarray(rng.standard_normal(q.shape), jnp.float32)

    def loss(fn):
        return lambda *a: jnp.sum(fn(*a, **kw) * cot)

    def both(fn):      # one program each: the value and the four gradients
        return jax.jit(lambda *a: (fn(*a, **kw), jax.grad(loss(fn), argnums=(0, 1, 2, 3))(*a)))

    (got, *fast), (want, *ref) = both(vsa_attention)(q, k, v, g), both(vsa_reference)(q, k, v, g)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=2e-5)
    grads = [fast[0], ref[0]]
    for a, b in zip(*grads):
        assert np.abs(np.asarray(b)).max() > 0
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=2e-5)


@pytest.mark.parametrize("grid, tile", [((3, 3, 5), (2, 2, 2)), ((2, 4, 4), (2, 2, 2)),
                                        ((3, 3, 5), (3, 2, 4))])
def test_the_fine_stage_on_the_flash_kernel_equals_the_reference(grid, tile, rng):
    """Each query tile one batch row of the flash kernel (interpreted) over its gathered
    tiles — one head a row where padded tiles are masked (3 x 3 x 5), the heads kept where
    none is (2 x 4 x 4); 24-token 3 x 2 x 4 tiles: forward and gradients as the
    reference's."""
    from ditax.attention.flash import flash_attention

    order, q, k, v, g, mask = _inputs(rng, grid=grid, tile=tile)
    call = functools.partial(flash_attention, interpret=True)
    kw = dict(tile_len=order.tile_len, topk=2, kv_mask=None if order.valid.all() else mask)
    cot = jnp.asarray(rng.standard_normal(q.shape), jnp.float32)

    def both(fn, **extra):
        def loss(*a):
            return jnp.sum(fn(*a, **kw, **extra) * cot)
        return jax.jit(lambda *a: (fn(*a, **kw, **extra), jax.grad(loss, argnums=(0, 1, 2, 3))(*a)))

    (got, gf), (want, gr) = (both(vsa_attention, call=call)(q, k, v, g),
                             both(vsa_reference)(q, k, v, g))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=2e-5)
    for a, b in zip(gf, gr):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=2e-5)


def test_the_flash_fine_stage_lowers_for_tpu():
    """VSA with the fine stage on the compiled flash kernel, forward and backward, lowers to
    Mosaic TPU at Wan 1.3B 480p x 81 (4 x 8 x 8 tiles: 168, 21 picked; nothing runs)."""
    from jax import export

    from ditax.attention.flash import flash_attention

    order = TileOrder((21, 30, 52), (4, 8, 8))
    call = functools.partial(flash_attention, interpret=False)
    q = jax.ShapeDtypeStruct((1, order.length, 2, 128), jnp.bfloat16)
    mask = jnp.asarray(order.valid)[None]

    def fwd(q, k, v, g):
        return vsa_attention(q, k, v, g, tile_len=256, topk=21, kv_mask=mask, call=call)

    def grad(q, k, v, g):
        return jax.grad(lambda *a: fwd(*a).astype(jnp.float32).sum(), argnums=(0, 1, 2, 3))(
            q, k, v, g)

    for fn in (fwd, grad):
        text = export.export(jax.jit(fn), platforms=["tpu"])(q, q, q, q).mlir_module()
        assert "tpu_custom_call" in text


def test_every_tile_and_no_gate_is_dense_attention(rng):
    order, q, k, v, _, mask = _inputs(rng)
    tiles = int(np.prod(order.tiles))
    got = vsa_attention(q, k, v, tile_len=order.tile_len, topk=tiles, kv_mask=mask)
    want = reference_attention(q, k, v, kv_mask=mask)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=2e-5)


def test_the_picks_are_the_pooled_scores_top_tiles(rng):
    """Each query tile picks the key tiles of its highest pooled scores (padding tokens out of
    the means), and the pick takes no gradient."""
    order, q, k, v, _, mask = _inputs(rng, b=1, n=1)
    t = order.tile_len
    _, picks = coarse(q, k, v, t, 2, mask)
    valid = order.valid.reshape(-1, t)
    def pooled(x):
        x = np.asarray(x)[0, :, 0].reshape(-1, t, x.shape[-1])
        return (x * valid[..., None]).sum(1) / valid.sum(1)[:, None]
    s = pooled(q) @ pooled(k).T
    want = np.argsort(-s, axis=1)[:, :2]
    np.testing.assert_array_equal(np.sort(np.asarray(picks)[0, 0], 1), np.sort(want, 1))


def test_bad_lengths_and_topk_are_refused(rng):
    _, q, k, v, _, _ = _inputs(rng)
    with pytest.raises(ValueError, match="topk=13 must be in 1..12"):
        vsa_attention(q, k, v, tile_len=8, topk=13)
    with pytest.raises(ValueError, match="not whole 7-token tiles"):
        vsa_attention(q, k, v, tile_len=7, topk=1)
    assert vsa_density(12, 8, 3) == pytest.approx(0.25 + 1 / 64)
