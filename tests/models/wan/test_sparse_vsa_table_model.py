"""VSA's table fine pass in the Wan transformer (``attention.sparsity=vsa
attention.backend=flash attention.vsa_fine=table``, issue 58): the model (kernels
interpreted on CPU) equals the jnp gather model on a padded grid, forward and the gradients
of its parameters; on a mesh (fsdp 2 x tensor 2, a padded grid: the table masks each key tile
whatever the head, so a tensor axis is taken) it equals one device; the key is checked in
one line."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ditax.attention.sparse.vsa import VsaCall
from ditax.attention.sparse.vsa_table import TableFine
from ditax.config import AttentionConfig, ModelConfig
from ditax.models.wan.build import init_model
from ditax.parallel.mesh import make_mesh
from sparse_reference import config_refusal

CFG = ModelConfig(num_attention_heads=4, attention_head_dim=16, ffn_dim=48, num_layers=1,
                  in_channels=4, out_channels=4, text_dim=24, freq_dim=16)
TABLE = AttentionConfig(backend="flash", sparsity="vsa", tile=(2, 2, 2), topk=2,
                        vsa_fine="table")


def _inputs(rng, b=2, y=6):
    return (rng.standard_normal((b, 4, 2, y, 8)).astype(np.float32),
            rng.uniform(0, 1000, (b,)).astype(np.float32),
            rng.standard_normal((b, 7, 24)).astype(np.float32))


def _with_gate(model):
    g = model.blocks.attn1.to_gate_compress
    g.kernel[...] = 0.3 * jax.random.normal(jax.random.key(1), g.kernel[...].shape)
    return model


def test_the_table_model_equals_the_gather_model(rng):
    """Grid 2 x 3 x 4 (y = 6 latent rows, patch 2) in 2 x 2 x 2 tiles: padded; 2 of 8 tiles
    picked. The same parameters under both configs; the value and every parameter's
    gradient of a random projection of the output."""
    lat, t, text = _inputs(rng)
    cot = jnp.asarray(rng.standard_normal(lat.shape), jnp.float32)
    results = []
    for acfg in (TABLE, dataclasses.replace(TABLE, backend="xla", vsa_fine="gather")):
        model = _with_gate(init_model(CFG, acfg, seed=4))
        graphdef, state = nnx.split(model)

        @jax.jit
        def run(state):
            def loss(state):
                out = nnx.merge(graphdef, state)(lat, t, text)
                return jnp.sum(out * cot), out
            return jax.value_and_grad(loss, has_aux=True)(state)

        (_, out), grads = run(state)
        results.append((out, grads))
    (got, g_got), (want, g_want) = results
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=2e-5)
    pairs = list(zip(jax.tree.leaves(g_got), jax.tree.leaves(g_want)))
    assert len(pairs) > 10
    for a, b in pairs:
        scale = max(1.0, float(np.abs(np.asarray(b)).max()))
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=5e-5 * scale)


def test_the_plan_runs_the_table():
    """The self-attention call is VSA with the table fine pass, and it carries the model's
    mesh (the kernels run under shard_map there)."""
    from ditax.attention.sparse.layout import sparse_layout
    from ditax.models.wan.build import abstract_model

    mesh = make_mesh(dict(data=1, fsdp=2, context=1, tensor=2), jax.devices()[:4])
    for m in (None, mesh):
        plan = abstract_model(CFG, TABLE, m).attention_plan
        call = sparse_layout(TABLE, (2, 3, 4)).plan(plan).self_attn
        assert isinstance(call, VsaCall) and isinstance(call.inner, TableFine)
        assert call.backend == "flash" and call.inner.mesh is m and call.inner.group == 0
    grouped = dataclasses.replace(TABLE, vsa_group=2)        # attention.vsa_group reaches it
    assert sparse_layout(grouped, (2, 3, 4)).plan(plan).self_attn.inner.group == 2


def test_the_mesh_equals_one_device_on_a_padded_grid(rng):
    inputs = _inputs(rng)
    single = _with_gate(init_model(CFG, TABLE, seed=3))
    mesh = make_mesh(dict(data=1, fsdp=2, context=1, tensor=2), jax.devices()[:4])
    sharded = init_model(CFG, TABLE, mesh=mesh, seed=3)
    g = sharded.blocks.attn1.to_gate_compress
    g.kernel[...] = jax.device_put(single.blocks.attn1.to_gate_compress.kernel[...],
                                   g.kernel[...].sharding)
    want = np.asarray(single(*inputs))
    got = np.asarray(sharded(*inputs))
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_the_layout_refuses_the_table_on_another_kernel():
    """Past the config's check (a model built from an unchecked config): the layout refuses
    the table on a self-attention that is not flash, in one line."""
    from ditax.attention.sparse.layout import sparse_layout
    from ditax.errors import ConfigError
    from ditax.models.wan.build import abstract_model

    acfg = dataclasses.replace(TABLE, backend="xla")
    plan = abstract_model(CFG, dataclasses.replace(acfg, vsa_fine="gather")).attention_plan
    with pytest.raises(ConfigError, match=r"^attention.vsa_fine=table runs on ditax's Pallas "
                                          r"table kernels.*self-attention runs xla; set "
                                          r"attention.backend=flash or vsa_fine=gather$"):
        sparse_layout(acfg, (2, 3, 4)).plan(plan)


@pytest.mark.parametrize("overrides, words", [
    (["attention.sparsity=vsa", "attention.topk=2", "attention.vsa_fine=table"],
     "attention.vsa_fine=table runs VSA's fine pass on ditax's Pallas table kernels, chosen "
     "with attention.backend=flash (is xla)"),
    (["attention.backend=flash", "attention.sparsity=radial", "attention.vsa_fine=table"],
     "attention.vsa_fine=table applies to attention.sparsity=vsa only (sparsity is radial)"),
    (["attention.backend=flash", "attention.sparsity=vsa", "attention.topk=2",
      "attention.vsa_fine=rows"], "attention.vsa_fine"),
    (["attention.backend=flash", "attention.sparsity=vsa", "attention.topk=2",
      "attention.vsa_group=2"], "attention.vsa_group=2 groups the picked key tiles of the "
     "table kernels' grid steps; attention.vsa_fine=gather has none"),
    (["attention.backend=flash", "attention.sparsity=radial", "attention.vsa_group=2"],
     "attention.vsa_group=2 applies to attention.sparsity=vsa attention.vsa_fine=table only"),
    (["attention.backend=flash", "attention.sparsity=vsa", "attention.topk=2",
      "attention.vsa_fine=table", "attention.vsa_group=3"],
     "attention.vsa_group=3 must be an int in 0..topk=2"),
])
def test_the_key_is_checked(overrides, words):
    message = config_refusal(overrides)
    assert words in message, message


def test_flash_with_the_table_is_valid():
    from ditax.config import load_config, validate

    for extra in ([], ["attention.vsa_group=1"], ["attention.vsa_group=2"]):
        validate(load_config("tiny", ["attention.backend=flash", "attention.sparsity=vsa",
                                      "attention.topk=2", "attention.vsa_fine=table"] + extra))


def test_bench_runs_the_table_and_names_it(capsys):
    """``ditax bench`` end to end on the tiny preset with the table fine pass (interpreted):
    its row names the sparsity's fine pass."""
    import json

    from ditax.cli import main

    rc = main(["bench", "tiny", "--latent", "2,8,8", "--text-len", "8", "--repeats", "1",
               "--no-progress", "attention.backend=flash", "attention.sparsity=vsa",
               "attention.tile=1,4,4", "attention.topk=2", "attention.vsa_fine=table"])
    out = capsys.readouterr().out
    assert rc == 0, out
    row = json.loads(out.strip().splitlines()[-1])
    assert row["attention"] == "flash" and row["sparsity"]["vsa_fine"] == "table"
    assert row["sparsity"]["topk"] == 2
