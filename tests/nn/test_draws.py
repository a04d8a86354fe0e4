"""A random init evaluated with its large draws in chunks (:func:`ditax.nn.draws.eval_chunked`,
what :func:`ditax.models.common.loaded.group_programs` runs): jax's values bit for bit, in a
program none of whose threefry draws writes more than the chunk."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.extend.core import jaxprs_in_params

from ditax.config import load_config
from ditax.models.common import loaded
from ditax.models.wan.build import _BUILD
from ditax.nn.draws import eval_chunked


def _chunked(f, chunk):
    closed = jax.make_jaxpr(f)(jax.random.key(0))
    return lambda k: eval_chunked(closed.jaxpr, closed.consts, [k], chunk)


def _largest_draw(jaxpr) -> int:
    sizes = [0]
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in ("random_bits", "threefry2x32"):
            sizes += [math.prod(v.aval.shape) for v in eqn.outvars]
        sizes += [_largest_draw(sub) for sub in jaxprs_in_params(eqn.params)]
    return max(sizes)


@pytest.mark.parametrize("draw", [
    lambda k: nnx.initializers.lecun_normal()(k, (96, 40), jnp.bfloat16),
    lambda k: nnx.initializers.lecun_normal()(k, (96, 40), jnp.float32),
    lambda k: jax.random.normal(k, (7, 3, 50), jnp.bfloat16),      # rows of 150: 2 a chunk
    lambda k: jax.random.uniform(k, (67, 33), jnp.float32),        # 67 rows: 1 a chunk
    lambda k: jax.random.bits(k, (128, 9), jnp.uint8),
    lambda k: jax.random.bits(k, (128, 9), jnp.uint32),
    lambda k: jax.random.truncated_normal(k, -2.0, 2.0, (40, 64), jnp.float32).reshape(
        40, 4, 16).transpose(1, 0, 2),                             # heads after the draw
])
def test_chunked_draws_equal_jax_bit_for_bit(draw):
    key = jax.random.key(11)
    want = jax.jit(draw)(key)
    got = jax.jit(_chunked(draw, 300))(key)[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert _largest_draw(jax.make_jaxpr(_chunked(draw, 300))(key).jaxpr) <= 300 < math.prod(
        want.shape)


def test_random_wan_init_in_chunks_equals_its_init():
    """A tiny Wan's whole init (stacked blocks under a scan, nested jits) in chunks of 4096
    elements: every parameter equal, and no threefry draw above the chunk (the plain init's
    largest is above it)."""
    cfg = load_config("tiny", ["model.param_dtype=bfloat16", "model.num_layers=3"])
    _, init, _ = loaded._init_parts(*_BUILD._init(cfg.model, cfg.attention, None, 0))
    closed = jax.make_jaxpr(init)()
    chunked = jax.jit(lambda: eval_chunked(closed.jaxpr, closed.consts, [], 4096))
    want = jax.tree_util.tree_leaves(jax.jit(init)())
    got = chunked()
    assert len(got) == len(want) > 20
    for a, b in zip(got, want):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert _largest_draw(closed.jaxpr) > 4096
    assert _largest_draw(jax.make_jaxpr(chunked)().jaxpr) <= 4096
