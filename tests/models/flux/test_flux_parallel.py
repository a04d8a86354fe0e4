"""Flux on meshes: sequence parallel attention over the joint sequence (``ulysses`` in its
three output layouts, ``ring``, ``ulysses_ring``), fsdp and tensor sharding, all equal to one
device; the shard-major joint layout moves no data between devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import ditax
from ditax.config import AttentionConfig
from ditax.models.flux.layout import JointLayout
from ditax.parallel import make_mesh
from flux_reference import TINY, flux_inputs, make_diffusers_flux, run_diffusers_flux
from wan_reference import rel_err

PAR = dict(TINY, num_attention_heads=4)      # 4 heads x 16: Ulysses over 4 shards


@pytest.fixture(scope="module")
def model(tmp_path_factory, fast_compile):
    return make_diffusers_flux(tmp_path_factory.mktemp("flux_par"), **PAR)


@pytest.fixture(scope="module")
def inputs():
    # 15 image and 5 text tokens: each stream padded on 4 context shards (16 + 8)
    return flux_inputs(np.random.default_rng(7), PAR, b=4, image=15, text=5)


@pytest.fixture(scope="module")
def single(model, inputs):
    m, folder = model
    out = np.asarray(ditax.load_transformer(folder)(**inputs))
    assert rel_err(out, run_diffusers_flux(m, inputs)) <= 1e-5
    return out


def test_ulysses_modes_bit_identical_and_equal_to_one_device(model, inputs, single):
    mesh = make_mesh({"fsdp": 2, "context": 4})
    outs = []
    for mode in ("flat", "chunked", "shard_major"):
        acfg = AttentionConfig(backend="ulysses", local="flash", out_a2a=mode, block_q=8,
                               block_kv=8)
        outs.append(np.asarray(ditax.load_transformer(model[1], mesh=mesh, attention=acfg)(
            **inputs)))
    assert rel_err(outs[0], single) <= 1e-5, rel_err(outs[0], single)
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])


@pytest.mark.parametrize("mesh_kw,acfg", [
    ({"fsdp": 2, "context": 4}, AttentionConfig(backend="ring", local="blockwise", block_kv=8)),
    ({"context": 4, "tensor": 2}, AttentionConfig(backend="ulysses_ring", local="xla",
                                                  ulysses_shards=2)),
], ids=["ring-fsdp2xctx4", "ulysses_ring-ctx4xtensor2"])
def test_ring_and_tensor_meshes_equal_one_device(model, inputs, single, mesh_kw, acfg):
    mesh = make_mesh(mesh_kw)
    tr = ditax.load_transformer(model[1], mesh=mesh, attention=acfg)
    # parameters are sharded: embed over fsdp x context, heads / MLP columns over tensor
    k = tr.module.transformer_blocks.attn.to_q.kernel[...]           # [layers, D, D]
    mlp = tr.module.single_transformer_blocks.proj_mlp.kernel[...]   # [layers, D, M]
    shards = mesh_kw.get("fsdp", 1) * mesh_kw.get("context", 1)
    assert k.sharding.shard_shape(k.shape)[1] == k.shape[1] // shards
    assert k.sharding.shard_shape(k.shape)[2] == k.shape[2] // mesh_kw.get("tensor", 1)
    assert mlp.sharding.shard_shape(mlp.shape)[2] == mlp.shape[2] // mesh_kw.get("tensor", 1)
    out = np.asarray(tr(**inputs))
    assert rel_err(out, single) <= 1e-5, rel_err(out, single)


def test_joining_the_streams_moves_no_data():
    """The shard-major join / split of image and text tokens compiles to no collective."""
    mesh = make_mesh({"context": 4, "fsdp": 2})
    layout = JointLayout(image=16, text=8, shards=4)
    tokens = NamedSharding(mesh, P("fsdp", "context", None))
    img = jax.device_put(jnp.arange(2 * 16 * 3.0).reshape(2, 16, 3), tokens)
    txt = jax.device_put(-jnp.arange(2 * 8 * 3.0).reshape(2, 8, 3), tokens)

    def roundtrip(img, txt):
        joint = jax.lax.with_sharding_constraint(layout.join(img, txt), tokens)
        return layout.split(joint * 2)

    compiled = jax.jit(roundtrip, out_shardings=(tokens, tokens)).lower(img, txt).compile()
    hlo = compiled.as_text()
    for op in ("all-gather", "all-to-all", "collective-permute", "all-reduce"):
        assert op not in hlo, op
    i2, t2 = compiled(img, txt)
    np.testing.assert_array_equal(i2, 2 * img)
    np.testing.assert_array_equal(t2, 2 * txt)
    joint = np.asarray(layout.join(img, txt))           # shard 1: image 4..7, then text 2..3
    np.testing.assert_array_equal(joint[:, 6:10], np.asarray(img)[:, 4:8])
    np.testing.assert_array_equal(joint[:, 10:12], np.asarray(txt)[:, 2:4])
