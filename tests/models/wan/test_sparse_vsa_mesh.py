"""VSA on a mesh (``attention.sparsity=vsa`` with fsdp 2 x tensor 2 of the 8 fake devices):
the model equals its single-device self, jnp (a padded grid) and flash (a grid of whole
tiles: the heads stay the kernel's heads, sharded over tensor); flash on a padded grid runs
one head a kernel row, so there a tensor axis is refused in one line."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from ditax.config import AttentionConfig, ModelConfig
from ditax.models.wan.build import init_model
from ditax.parallel.mesh import make_mesh

CFG = ModelConfig(num_attention_heads=4, attention_head_dim=16, ffn_dim=48, num_layers=1,
                  in_channels=4, out_channels=4, text_dim=24, freq_dim=16)
MESH = dict(data=1, fsdp=2, context=1, tensor=2)


def _inputs(rng, y):
    return (rng.standard_normal((2, 4, 2, y, 8)).astype(np.float32),
            rng.uniform(0, 1000, (2,)).astype(np.float32),
            rng.standard_normal((2, 7, 24)).astype(np.float32))


@pytest.mark.parametrize("backend, tile, y", [("xla", (1, 2, 2), 6), ("flash", (2, 2, 2), 8)])
def test_the_mesh_equals_one_device(backend, tile, y, rng):
    acfg = AttentionConfig(backend=backend, sparsity="vsa", tile=tile, topk=2)
    inputs = _inputs(rng, y)
    single = init_model(CFG, acfg, seed=3)
    g = single.blocks.attn1.to_gate_compress
    g.bias[...] = jax.random.normal(jax.random.key(0), g.bias[...].shape)
    mesh = make_mesh(MESH, jax.devices()[:4])
    sharded = init_model(CFG, acfg, mesh=mesh, seed=3)
    sharded.blocks.attn1.to_gate_compress.bias[...] = jax.device_put(
        g.bias[...], sharded.blocks.attn1.to_gate_compress.bias[...].sharding)
    want = np.asarray(single(*inputs))
    got = np.asarray(sharded(*inputs))
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_flash_on_a_padded_grid_refuses_a_tensor_axis(rng):
    from ditax.errors import ConfigError

    from ditax.attention.sparse.layout import sparse_layout
    from ditax.models.wan.build import abstract_model

    acfg = AttentionConfig(backend="flash", sparsity="vsa", tile=(2, 2, 2), topk=2)
    plan = abstract_model(CFG, acfg, make_mesh(MESH, jax.devices()[:4])).attention_plan
    with pytest.raises(ConfigError, match=r"2x3x4 grid that is no multiple of attention.tile="
                                          r"2,2,2 .*needs mesh.tensor=1 \(is 2\)"):
        sparse_layout(acfg, (2, 3, 4)).plan(plan)
