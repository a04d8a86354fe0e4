"""LTX-2's attention layer head-major (q / k / v ``[B, N, L, K]`` from the projections, for the
TPU kernels) equals the token-major layer, values and gradients: split and interleaved RoPE,
per-head gates, the spatio-temporal-guidance blend, RoPE groups that are not the heads (the
token-major layer then)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ditax.attention.plan import resolve
from ditax.models.ltx2.transformer.attention import Attention
from ditax.models.ltx2.transformer.rope import Rope
from ditax.parallel.sharding import ShardingContext

N, K, D, L = 2, 16, 24, 128


def _rope(rng, groups, width):
    ang = rng.standard_normal((1, L, groups, width)).astype(np.float32)
    return Rope(jnp.cos(ang), jnp.sin(ang))


@pytest.mark.parametrize("split,groups,gated,perturb", [
    (True, N, True, True), (False, N, False, False), (True, 1, False, False)],
    ids=["split-gated-stg", "interleaved", "groups-not-heads"])
def test_head_major_equals_token_major(rng, split, groups, gated, perturb):
    att = Attention(D, D, N, K, bias=True, out_bias=True, gated=gated, dtype=jnp.float32,
                    param_dtype=jnp.float32, rngs=nnx.Rngs(0))
    width = N * K // groups // (2 if split else 1)
    rope = _rope(rng, groups, width)
    x = jnp.asarray(rng.standard_normal((2, L, D)), jnp.float32)
    w = jnp.asarray([0.3, 1.0], jnp.float32) if perturb else None
    tokens = resolve("xla", {})
    heads = resolve("splash", {"interpret": True})
    assert heads.reads_head_major and not tokens.reads_head_major
    sh = ShardingContext()

    def loss(a, x, call):
        out = a(x, x, call, sh, q_rope=rope, split_rope=split, perturb=w)
        return jnp.sum(out * jnp.cos(out)), out

    (_, o1), g1 = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(att, x, tokens)
    (_, o2), g2 = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(att, x, heads)
    np.testing.assert_allclose(o2, o1, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(g2[1], g1[1], rtol=1e-4, atol=1e-4)
    for a, b in zip(jax.tree.leaves(nnx.state(g2[0])), jax.tree.leaves(nnx.state(g1[0]))):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
