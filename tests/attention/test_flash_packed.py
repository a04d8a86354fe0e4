"""The packed-layout flash kernel (``[.., L, N·K]``, partial last blocks, no padding) against
the head-major flash path it replaces: bit-identical outputs, lse and gradients (interpret
mode on CPU; ``tests/plan/test_tpu_compile.py`` compiles it for v6e)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ditax.attention.flash as fl


def _arr(rng, dtype, *shape):
    return jnp.asarray(rng.standard_normal(shape), dtype)


@pytest.mark.parametrize("dtype,prev", [(jnp.float32, False), (jnp.bfloat16, True)])
def test_packed_flash_attention_bit_identical_to_head_major(rng, monkeypatch, dtype, prev):
    """Lq=300 / Lk=200 with blocks of 128 (partial last blocks), a key mask with one batch
    row all masked, K=128 (packable): forward, lse and the gradients of q, k, v (and of a
    previous partial) equal the zero-padded head-major path's bit for bit."""
    B, Lq, Lk, N, K = 2, 300, 200, 2, 128
    q, k, v = (_arr(rng, dtype, B, n, N, K) for n in (Lq, Lk, Lk))
    mask = jnp.asarray(rng.random((B, Lk)) > 0.3).at[1].set(False)
    extra = (_arr(rng, dtype, B, Lq, N, K), _arr(rng, jnp.float32, B, N, Lq)) if prev else ()

    def loss(packed):
        def f(q, k, v, *p):
            monkeypatch.setattr(fl, "packable", lambda n, kd: packed)
            o, lse = fl.flash_attention(q, k, v, kv_mask=mask, block_q=128, block_kv=128,
                                        return_lse=True, o_prev=p[0] if p else None,
                                        lse_prev=p[1] if p else None, interpret=True)
            w = jnp.cos(jnp.arange(o.size, dtype=jnp.float32)).reshape(o.shape)
            s = jnp.sum(o.astype(jnp.float32) * w)
            return s + 0.3 * jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0)), (o, lse)
        args = (0, 1, 2, 3, 4) if prev else (0, 1, 2)
        vg = jax.value_and_grad(f, argnums=args, has_aux=True)
        # without a previous partial: jitted (one program, not one per eager op); with one,
        # eager, since XLA fuses the jnp pass over the partial differently per layout and
        # that gradient would then differ in rounding, not in the kernels
        return (vg if prev else jax.jit(vg))(q, k, v, *extra)

    (_, (o1, l1)), g1 = loss(True)
    (_, (o0, l0)), g0 = loss(False)
    assert o1.shape == q.shape and l1.shape == (B, N, Lq)
    assert jnp.array_equal(o1, o0) and jnp.array_equal(l1, l0)
    assert np.all(np.asarray(o1[1]) == 0) == (not prev)
    for a, b in zip(g1, g0):
        assert bool(jnp.all(jnp.isfinite(a.astype(jnp.float32))))
        assert jnp.array_equal(a, b)
