"""Random init on the chip: the grouped init with its draws in chunks
(:func:`ditax.models.common.loaded.group_programs`, :func:`ditax.nn.draws.eval_chunked`)
writes the plain jitted init's values bit for bit, on the TPU's own arithmetic."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tpu_fixtures import chip  # noqa: F401  (fixture)

import ditax
from ditax.config import load_config
from ditax.models.common import loaded
from ditax.models.wan.build import _BUILD
from ditax.nn.draws import eval_chunked
from ditax.parallel.mesh import make_mesh

pytestmark = pytest.mark.tpu


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_chunked_lecun_draw_equals_the_plain_draw(chip, dtype):
    def draw(k):
        return nnx.initializers.lecun_normal()(k, (1536, 8960), dtype)

    closed = jax.make_jaxpr(draw)(jax.random.key(0))
    key = jax.device_put(jax.random.key(5), chip)
    with ditax.target_platform(chip.platform, device_kind=getattr(chip, "device_kind", "")):
        want = jax.jit(draw)(key)
        got = jax.jit(lambda k: eval_chunked(closed.jaxpr, closed.consts, [k], 1 << 18))(key)
    np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want))


def test_grouped_chunked_wan_init_equals_the_plain_init(chip, monkeypatch):
    monkeypatch.setattr(loaded, "DRAW_CHUNK", 4096)
    cfg = load_config("tiny", ["model.param_dtype=bfloat16", "model.num_layers=3"])
    mesh = make_mesh(dict(data=1, fsdp=1, context=1, tensor=1), [chip])
    with ditax.target_platform(chip.platform, device_kind=getattr(chip, "device_kind", "")):
        _, init, out = loaded._init_parts(*_BUILD._init(cfg.model, cfg.attention, mesh, 0))
        want = jax.tree_util.tree_leaves(jax.jit(init, out_shardings=out)())
        got = jax.tree_util.tree_leaves(loaded.run_grouped(init, out, 1 << 16))
    assert len(got) == len(want) > 20
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.sharding == b.sharding
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
