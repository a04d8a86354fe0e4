"""The flash forward's block-loop variants (``Tune.variant``, kernels/flash_variant.py; issue
54 item 2) against the jnp reference in interpret mode: output, log-sum-exp and gradients,
with lengths that are not block multiples, a key mask, the packed (K = 128) and padded
(K = 64) layouts, a compute block smaller than the key block (the loop ``unroll`` unrolls),
and a ring continuation from a previous partial. The deviceless v5e compile of each variant
at Wan 1.3B 480p's shape is in tests/plan/test_flash_variants_tpu.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ditax.attention.flash import Variant, flash_attention, flash_attention_tuned, flash_tune
from ditax.attention.reference import reference_attention
from attention_inputs import make_inputs, o_lse_loss

VARIANTS = ["unroll", "lanes", "prescale", "pv_f32", "all"]


def _flash(variant, **blocks):
    """flash_attention with the forward's ``variant`` (interpret mode)."""
    def fn(q, k, v, **kw):
        bq, bkv, tune = flash_tune(q, k, interpret=True, **blocks)
        return flash_attention_tuned(q, k, v, tune._replace(variant=Variant.parse(variant)),
                                     block_q=bq, block_kv=bkv, interpret=True, **kw)
    return fn


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("K,masked", [(128, False), (64, True)], ids=["packed", "padded-mask"])
def test_variant_matches_reference_forward_and_grad(rng, variant, K, masked):
    """Lq = 40, Lk = 72 with blocks (16, 32) and 16-key compute slices: partial last blocks
    (read past the arrays when packed, padded and masked when not), two slices a key block."""
    q, k, v = make_inputs(rng, 1, 40, 72, 2, K, masked=False)[:3]
    mask = jnp.asarray(rng.random((1, 72)) > 0.3) if masked else None
    fl = _flash(variant, block_q=16, block_kv=32, block_kv_compute=16)
    (_, (o, lse)), g = jax.jit(jax.value_and_grad(o_lse_loss(fl, mask), argnums=(0, 1, 2),
                                                  has_aux=True))(q, k, v)
    (_, (o_ref, lse_ref)), g_ref = jax.jit(jax.value_and_grad(
        o_lse_loss(reference_attention, mask), argnums=(0, 1, 2), has_aux=True))(q, k, v)
    assert o.shape == q.shape and lse.shape == (1, 2, 40) and lse.dtype == jnp.float32
    np.testing.assert_allclose(o, o_ref, atol=3e-6, rtol=1e-5)
    np.testing.assert_allclose(lse, lse_ref, atol=3e-6, rtol=1e-6)
    for a, b in zip(g, g_ref):
        np.testing.assert_allclose(a, b, atol=3e-5, rtol=1e-4)


@pytest.mark.parametrize("variant", ["lanes+prescale", "all"])
def test_variant_continues_from_previous_partial(rng, variant):
    """A ring step: flash over keys B continuing from A's (o, lse) equals attention over A+B
    (the variants' running state starts from lse_prev in their own units); batch 1 has every
    A key masked (the empty start)."""
    B, Lq, La, Lb, N, K = 2, 20, 16, 24, 2, 128
    q, ka, va = make_inputs(rng, B, Lq, La, N, K, masked=False)[:3]
    _, kb, vb = make_inputs(rng, B, Lq, Lb, N, K, masked=False)[:3]
    ma = jnp.asarray(rng.random((B, La)) > 0.3).at[1].set(False)
    fl = _flash(variant, block_q=8, block_kv=16, block_kv_compute=8)

    def chained(q, ka, va, kb, vb):
        o_a, lse_a = fl(q, ka, va, kv_mask=ma, return_lse=True)
        return fl(q, kb, vb, o_prev=o_a, lse_prev=lse_a, return_lse=True)

    def whole(q, ka, va, kb, vb):
        cat = lambda a, b: jnp.concatenate([a, b], axis=1)  # noqa: E731
        return reference_attention(q, cat(ka, kb), cat(va, vb), return_lse=True,
                                   kv_mask=cat(ma, jnp.ones((B, Lb), bool)))

    def loss(fn):
        def f(*args):
            o, lse = fn(*args)
            w = jnp.sin(jnp.arange(o.size, dtype=jnp.float32)).reshape(o.shape)
            return jnp.sum(o * w) + 0.3 * jnp.sum(lse), (o, lse)
        return f

    args = (q, ka, va, kb, vb)
    (_, (o, lse)), g = jax.jit(jax.value_and_grad(loss(chained), argnums=range(5),
                                                  has_aux=True))(*args)
    (_, (o_ref, lse_ref)), g_ref = jax.jit(jax.value_and_grad(loss(whole), argnums=range(5),
                                                              has_aux=True))(*args)
    np.testing.assert_allclose(o, o_ref, atol=3e-6, rtol=1e-5)
    np.testing.assert_allclose(lse, lse_ref, atol=3e-6, rtol=1e-6)
    for a, b in zip(g, g_ref):
        np.testing.assert_allclose(a, b, atol=3e-5, rtol=1e-4)


def test_plain_variant_is_the_default_kernel_bit_for_bit(rng):
    """``Variant()`` is the kernel flash_attention runs (same values, bit for bit), and the
    variants' names parse both ways."""
    q, k, v = make_inputs(rng, 1, 24, 40, 2, 128, masked=False)[:3]
    blocks = dict(block_q=8, block_kv=16, block_kv_compute=8)
    o, lse = jax.jit(lambda *a: flash_attention(*a, return_lse=True, interpret=True,
                                                **blocks))(q, k, v)
    o2, lse2 = jax.jit(lambda *a: _flash("plain", **blocks)(*a, return_lse=True))(q, k, v)
    assert np.array_equal(o, o2) and np.array_equal(lse, lse2)
    assert Variant.parse("unroll+prescale") == Variant(unroll=True, prescale=True)
    assert Variant.parse("all").name == "unroll+lanes+prescale+pv_f32"
    assert Variant.parse("plain") == Variant() and Variant().name == "plain"


def test_unknown_variant_flag_is_named():
    with pytest.raises(ValueError, match=r"variant 'unroll\+fast': unknown flag\(s\) \['fast'\]"):
        Variant.parse("unroll+fast")


def test_bf16_variants_stay_within_bf16_rounding_of_the_plain_kernel(rng):
    """In bf16 the pre-scaled q is rounded to bf16 (as splash's is): the output stays
    within bf16 rounding of the plain kernel's."""
    q, k, v = (x.astype(jnp.bfloat16)
               for x in make_inputs(rng, 1, 32, 64, 2, 128, masked=False)[:3])
    blocks = dict(block_q=16, block_kv=32, block_kv_compute=16)
    ref = jax.jit(_flash("plain", **blocks))(q, k, v).astype(jnp.float32)
    for variant in ("prescale", "all"):
        o = jax.jit(_flash(variant, **blocks))(q, k, v).astype(jnp.float32)
        np.testing.assert_allclose(o, ref, atol=2e-2, rtol=2e-2)
        assert not np.array_equal(o, ref)       # the variant ran (q rounded after scaling)


def test_all_flags_with_a_block_table(rng):
    """The variants keep the block-sparse path (block lists ahead of the refs, the scaled q
    copy after the scratch): every flag with a radial table over 16-token tiles (two 8-key
    compute slices a block) equals flash without them, up to float32 rounding."""
    from ditax.attention.sparse.masks import BlockTable, radial_blocks
    from ditax.attention.sparse.tiles import TileOrder

    order = TileOrder((8, 3, 8), (1, 2, 8))
    table = BlockTable.of(order, radial_blocks(order, 0.5))
    L = int(np.prod(order.grid))
    q, k, v = (order.to_tiles(jnp.asarray(rng.standard_normal((1, L, 2, 32)), jnp.float32))
               for _ in range(3))
    valid = jnp.asarray(order.valid)[None]
    b = order.tile_len

    def run(variant):
        bq, bkv, tune = flash_tune(q, k, block_q=b, block_kv=b, block_kv_compute=b // 2,
                                   interpret=True)
        t = tune._replace(table=table, variant=Variant.parse(variant))
        return jax.jit(lambda q, k, v: flash_attention_tuned(
            q, k, v, t, block_q=bq, block_kv=bkv, kv_mask=valid, interpret=True))(q, k, v)

    np.testing.assert_allclose(run("all"), run("plain"), atol=2e-6, rtol=1e-5)
