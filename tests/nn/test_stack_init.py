"""Stacks drawn one block at a time (:func:`ditax.nn.stack.make_stack`): the values an
``nnx.vmap`` over the split keys draws, in a program whose draws do not grow with the depth
(a TPU compile's time grows with the elements a fusion draws: 30 vmapped layers of Wan 2.1
1.3B took over a minute to compile for a v5e, ``benchmarks/init_speed.py``)."""

import math

import jax
import numpy as np
from flax import nnx
from jax.extend.core import jaxprs_in_params

from ditax.config import load_config
from ditax.models.common import loaded
from ditax.models.wan.build import _BUILD
from ditax.models.wan.transformer import WanBlock
from ditax.nn.stack import make_stack


def _drawn_elements(jaxpr) -> int:
    """Elements the random draws of ``jaxpr`` write, each draw counted once (a loop body's
    once, however many times it runs)."""
    total = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in ("random_bits", "threefry2x32"):
            total += sum(math.prod(v.aval.shape) for v in eqn.outvars)
        for sub in jaxprs_in_params(eqn.params):
            total += _drawn_elements(sub)
    return total


def _wan_init_jaxpr(layers: int):
    cfg = load_config("tiny", ["model.param_dtype=bfloat16", f"model.num_layers={layers}"])
    _, init, _ = loaded._init_parts(*_BUILD._init(cfg.model, cfg.attention, None, 0))
    return jax.make_jaxpr(init)().jaxpr


def test_stack_equals_the_vmapped_draw_bit_for_bit():
    cfg = load_config("tiny", ["model.param_dtype=bfloat16"]).model
    depth = 4

    @nnx.split_rngs(splits=depth)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def vmapped(rngs):
        return WanBlock(cfg, rngs=rngs)

    ref_rngs, rngs = nnx.Rngs(3), nnx.Rngs(3)
    ref = nnx.to_flat_state(nnx.state(vmapped(ref_rngs)))
    got = nnx.to_flat_state(nnx.state(make_stack(lambda r: WanBlock(cfg, rngs=r), depth, rngs)))
    assert [p for p, _ in got] == [p for p, _ in ref] and len(got) > 10
    for (path, a), (_, b) in zip(got, ref):
        assert a.get_value().shape[0] == depth, path
        assert a.get_value().dtype == b.get_value().dtype, path
        np.testing.assert_array_equal(np.asarray(a.get_value()), np.asarray(b.get_value()))
    # the caller's streams move on as they did (the next draw is the same)
    np.testing.assert_array_equal(jax.random.key_data(rngs.params()),
                                  jax.random.key_data(ref_rngs.params()))


def test_init_draws_do_not_grow_with_the_depth():
    """A random Wan's init program draws the same elements with 2 layers as with 8 (its
    blocks' draws are one block's, in a loop); a vmapped stack's grew 4x."""
    two, eight = _drawn_elements(_wan_init_jaxpr(2)), _drawn_elements(_wan_init_jaxpr(8))
    assert two > 0 and eight == two
