"""Splash without a kv_mask: the padded keys are a static mask (only the blocks that hold
them are masked, no segment ids), and the results equal the reference's."""

import jax
import jax.numpy as jnp
import numpy as np
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


def test_key_length_mask_masks_only_the_last_kv_blocks():
    """The kernel's block map: whole blocks (2) everywhere but the kv blocks holding padded
    keys (1: partial); a block of padding alone is skipped (0)."""
    from jax.experimental.pallas.ops.tpu import splash_attention as sa
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info

    from ditax.attention.splash import _block_mask

    info, _ = splash_attention_mask_info.process_mask(
        sa.MultiHeadMask([_block_mask((256, 512), None, 300)]), (128, 128),
        shrink_grid=False)
    np.testing.assert_array_equal(np.asarray(info.block_mask)[0],
                                  [[2, 2, 1, 0], [2, 2, 1, 0]])
