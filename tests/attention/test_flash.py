"""ditax's Pallas flash kernel (interpret mode on CPU) against the jnp reference.

Shapes are tiny: interpret mode runs the grid as a loop of jnp ops and compiles slowly.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ditax.attention import attend
from ditax.attention.flash import (
    check_shard_major_supported,
    effective_block,
    flash_attention,
    flash_attention_shard_major,
)
from ditax.attention.reference import reference_attention
from attention_inputs import o_lse_loss


def _qkv(rng, B, Lq, Lk, N, K):
    f = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)  # noqa: E731
    return f(B, Lq, N, K), f(B, Lk, N, K), f(B, Lk, N, K)


@pytest.mark.parametrize("K,Lq,Lk,masked", [(64, 40, 24, True), (128, 16, 16, False)])
def test_flash_matches_reference_forward_and_grad(rng, K, Lq, Lk, masked):
    """Lengths that are not block multiples (40, 24 with blocks of 16) are padded and masked."""
    q, k, v = _qkv(rng, 1, Lq, Lk, 2, K)
    mask = jnp.asarray(rng.random((1, Lk)) > 0.3) if masked else None
    fl = lambda *a, **kw: flash_attention(*a, block_q=16, block_kv=16, **kw)  # noqa: E731
    # jitted: one program each instead of one per eager op (the kernel is the same)
    (_, (o, lse)), g = jax.jit(jax.value_and_grad(o_lse_loss(fl, mask), argnums=(0, 1, 2),
                                                  has_aux=True))(q, k, v)
    (_, (o_ref, lse_ref)), g_ref = jax.jit(jax.value_and_grad(
        o_lse_loss(reference_attention, mask), argnums=(0, 1, 2), has_aux=True))(q, k, v)
    assert o.shape == q.shape and lse.shape == (1, 2, Lq) and lse.dtype == jnp.float32
    np.testing.assert_allclose(o, o_ref, atol=2e-6, rtol=1e-5)
    np.testing.assert_allclose(lse, lse_ref, atol=2e-6, rtol=1e-6)
    for a, b in zip(g, g_ref):
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4)


def test_flash_fully_masked_rows_are_zero_and_dispatch(rng):
    q, k, v = _qkv(rng, 2, 8, 12, 2, 32)
    mask = jnp.asarray(rng.random((2, 12)) > 0.5).at[1].set(False)
    o, lse = jax.jit(lambda q, k, v, m: flash_attention(q, k, v, kv_mask=m, return_lse=True))(
        q, k, v, mask)
    assert np.all(np.asarray(o[1]) == 0) and np.all(np.isneginf(np.asarray(lse[1])))
    o2 = jax.jit(lambda q, k, v, m: attend(q, k, v, backend="flash", kv_mask=m, block_q=8,
                                           block_kv=8))(q, k, v, mask)
    np.testing.assert_allclose(o2, reference_attention(q, k, v, kv_mask=mask), atol=2e-6)


def test_shard_major_blockspecs_bit_exact_vs_plain_layout(rng):
    """q/k/v given shard-major ``[U, B, N, Lc, K]`` (5-D), output written shard-major, equals
    the plain ``[B, U*Lc, N, K]`` call bit for bit (same blocks visited in the same order)."""
    U, B, N, Lc, K = 4, 1, 2, 16, 32
    q, k, v = _qkv(rng, B, U * Lc, U * Lc, N, K)
    mask = jnp.asarray(rng.random((B, U * Lc)) > 0.25)
    o_plain, lse_plain = jax.jit(lambda q, k, v, m: flash_attention(
        q, k, v, kv_mask=m, block_q=8, block_kv=8, return_lse=True))(q, k, v, mask)

    def shard_major(x):  # [B, U*Lc, N, K] -> [U, B, N, Lc, K]
        return jnp.transpose(x.reshape(B, U, Lc, N, K), (1, 0, 3, 2, 4))

    o5, lse5 = jax.jit(lambda q, k, v, m: flash_attention_shard_major(
        q, k, v, kv_keep=m, block_q=8, block_kv=8, return_lse=True))(
        shard_major(q), shard_major(k), shard_major(v), mask.reshape(B, U, Lc))
    assert o5.shape == (U, B, N, Lc, K) and lse5.shape == (U, B, N, Lc)
    o_back = jnp.transpose(o5, (1, 0, 3, 2, 4)).reshape(B, U * Lc, N, K)
    lse_back = jnp.transpose(lse5, (1, 2, 0, 3)).reshape(B, N, U * Lc)
    assert jnp.array_equal(o_back, o_plain)
    assert jnp.array_equal(lse_back, lse_plain)


def test_shard_major_refuses_unaligned_shards(rng):
    q = jnp.zeros((2, 1, 2, 12, 32))
    with pytest.raises(ValueError, match="Lc=12.*block_q=8"):
        flash_attention_shard_major(q, q, q, block_q=8, block_kv=8)


def test_support_checks_name_the_value():
    assert check_shard_major_supported(64, 128, 128, jnp.float32) == []
    reasons = check_shard_major_supported(36, 12, 128, jnp.float64)
    assert any("K=36" in r for r in reasons)
    assert any("block_q=12" in r for r in reasons)
    assert any("float64" in r for r in reasons)
    assert effective_block(128, 20) == 24 and effective_block(16, 200) == 16
    with pytest.raises(ValueError, match="positive"):
        effective_block(0, 10)


def test_flash_continues_from_previous_partial_forward_and_grad(rng):
    """Keys split in two chunks A, B: flash over B continuing from A's (o, lse) equals
    attention over A+B — output, lse, and gradients w.r.t. q and both chunks' k/v (the A terms
    flow through the o_prev/lse_prev cotangents). Batch 1 has every A key masked (lse_prev =
    -inf, the empty start); batch 0 row set has some B keys masked. Lq=20 is padded."""
    B, Lq, La, Lb, N, K = 2, 20, 16, 8, 2, 32
    q, ka, va = _qkv(rng, B, Lq, La, N, K)
    _, kb, vb = _qkv(rng, B, Lq, Lb, N, K)
    ma = jnp.asarray(rng.random((B, La)) > 0.3).at[1].set(False)
    mb = jnp.asarray(rng.random((B, Lb)) > 0.3).at[1, 0].set(True)
    fl = lambda *a, **kw: flash_attention(*a, block_q=8, block_kv=8, return_lse=True, **kw)  # noqa

    def chained(q, ka, va, kb, vb):
        o_a, lse_a = fl(q, ka, va, kv_mask=ma)
        o, lse = fl(q, kb, vb, kv_mask=mb, o_prev=o_a.astype(jnp.float32), lse_prev=lse_a)
        return o, lse, jax.lax.stop_gradient(lse_a)

    def whole(q, ka, va, kb, vb):
        cat = lambda a, b: jnp.concatenate([a, b], axis=1)  # noqa: E731
        return (*reference_attention(q, cat(ka, kb), cat(va, vb), kv_mask=cat(ma, mb),
                                     return_lse=True), None)

    def loss(fn):
        def f(*args):
            o, lse, lse_a = fn(*args)
            w = jnp.cos(jnp.arange(o.size, dtype=jnp.float32)).reshape(o.shape)
            return (jnp.sum(o * w) + 0.3 * jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0)),
                    (o, lse, lse_a))
        return f

    args = (q, ka, va, kb, vb)
    # jitted: one program each instead of one per eager op (the kernel is the same)
    (_, (o, lse, lse_a)), g = jax.jit(jax.value_and_grad(loss(chained), argnums=range(5),
                                                         has_aux=True))(*args)
    (_, (o_ref, lse_ref, _)), g_ref = jax.jit(jax.value_and_grad(loss(whole), argnums=range(5),
                                                                 has_aux=True))(*args)
    assert np.all(np.isneginf(np.asarray(lse_a)[1]))   # batch 1: the empty start
    assert o.dtype == jnp.float32 and o.shape == q.shape and lse.shape == (B, N, Lq)
    np.testing.assert_allclose(o, o_ref, atol=2e-6, rtol=1e-5)
    np.testing.assert_allclose(lse, lse_ref, atol=2e-6, rtol=1e-6)
    for a, b in zip(g, g_ref):
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4)


def test_flash_previous_partial_refusals(rng):
    q, k, v = _qkv(rng, 1, 8, 8, 2, 32)
    with pytest.raises(ValueError, match="o_prev and lse_prev together"):
        flash_attention(q, k, v, o_prev=q)
    with pytest.raises(ValueError, match=r"lse_prev\(1, 8, 2\).*lse \(1, 2, 8\)"):
        flash_attention(q, k, v, o_prev=q, lse_prev=jnp.zeros((1, 8, 2)))


def test_flash_lowers_for_tpu_at_wan_lengths():
    """The compiled (non-interpreted) kernel lowers to Mosaic TPU — forward, backward, the
    shard-major layout and the ring continuation — at a Wan 480p per-device length, with only
    [block, K] tiles resident (nothing on a TPU is run; jax.export lowers for the platform)."""
    from jax import export

    from ditax.attention.flash import flash_attention, flash_attention_shard_major

    L = 32768
    q = jax.ShapeDtypeStruct((1, L, 2, 128), jnp.bfloat16)

    def fwd(q, k, v):
        return flash_attention(q, k, v, block_q=512, block_kv=512, interpret=False)

    def grad(q, k, v):
        return jax.grad(lambda *a: fwd(*a).astype(jnp.float32).sum(), argnums=(0, 1, 2))(q, k, v)

    U = 4
    q5 = jax.ShapeDtypeStruct((U, 1, 2, L // U, 128), jnp.bfloat16)
    lse5 = jax.ShapeDtypeStruct((U, 1, 2, L // U), jnp.float32)
    o5 = jax.ShapeDtypeStruct((U, 1, 2, L // U, 128), jnp.float32)

    def shard_major(q, k, v, o_prev, lse_prev):
        return flash_attention_shard_major(q, k, v, block_q=512, block_kv=512, interpret=False,
                                           o_prev=o_prev, lse_prev=lse_prev, return_lse=True)

    for fn, args in ((fwd, (q, q, q)), (grad, (q, q, q)), (shard_major, (q5, q5, q5, o5, lse5))):
        text = export.export(jax.jit(fn), platforms=["tpu"])(*args).mlir_module()
        assert "tpu_custom_call" in text


def test_flash_refuses_compiled_run_on_gpu():
    import ditax
    import ditax.attention.flash as F
    from ditax.attention import AttentionUnavailable

    q = jnp.zeros((1, 16, 2, 32), jnp.float32)
    with ditax.target_platform("gpu"):
        with pytest.raises(AttentionUnavailable,
                           match=r"targets TPU .*use backend='cudnn' or 'te'"):
            F.flash_attention(q, q, q, interpret=False)
        with pytest.raises(AttentionUnavailable, match=r"targets TPU"):
            attend(q, q, q, backend="flash")               # interpret=None: compiled on GPU
        assert any("targets TPU" in r for r in F.check_shard_major_supported(32, 8, 8, q.dtype))
        assert F.default_interpret() is False
    assert F.default_interpret() is True                   # CPU again: interpreted
    assert F.check_shard_major_supported(32, 8, 8, q.dtype) == []
