"""Splash without a kv_mask at lengths that are not block multiples (the padded keys masked
by the wrapper): forward and gradients equal the reference's."""

import jax
import jax.numpy as jnp
from attention_inputs import F32_TOL, GRAD_TOL, make_inputs, rel_err

from ditax.attention.reference import reference_attention
from ditax.attention.splash import splash_attention


def test_unmasked_padded_lengths_forward_and_gradients(rng):
    """Lq 200 / Lk 330 with 128 tiles: the last kv block holds 54 padded keys."""
    q, _, _, _ = make_inputs(rng, 2, 200, 330, 2, 64, False)
    _, k, v, _ = make_inputs(rng, 2, 330, 330, 2, 64, False)
    ct = jnp.asarray(rng.standard_normal(q.shape), jnp.float32)

    def fn(q, k, v):
        return splash_attention(q, k, v, block_q=128, block_kv=128, interpret=True)

    out, ref = jax.jit(fn)(q, k, v), reference_attention(q, k, v)
    assert rel_err(out, ref) <= F32_TOL, rel_err(out, ref)

    def loss(f):
        return lambda q, k, v: jnp.sum(f(q, k, v) * ct)

    got = jax.jit(jax.grad(loss(fn), argnums=(0, 1, 2)))(q, k, v)
    want = jax.grad(loss(reference_attention), argnums=(0, 1, 2))(q, k, v)
    for name, g, w in zip("qkv", got, want):
        assert rel_err(g, w) <= GRAD_TOL, (name, rel_err(g, w))


def test_an_unknown_tile_keyword_is_refused_in_one_line(rng):
    import pytest

    q, k, v, _ = make_inputs(rng, 1, 128, 128, 1, 32, False)
    with pytest.raises(TypeError, match=r"unknown keyword 'block_x'; its tiles are block_q"):
        splash_attention(q, k, v, block_x=128, interpret=True)
