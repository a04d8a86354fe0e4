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
from ditax.models.common.joint_layout import JointLayout
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


def _check_sharded(tr, mesh_kw):
    """Parameters are sharded: embed over fsdp x context, heads / MLP columns over tensor."""
    k = tr.module.transformer_blocks.attn.to_q.kernel[...]           # [layers, D, D]
    mlp = tr.module.single_transformer_blocks.proj_mlp.kernel[...]   # [layers, D, M]
    shards, tensor = mesh_kw.get("fsdp", 1) * mesh_kw.get("context", 1), mesh_kw.get("tensor", 1)
    assert k.sharding.shard_shape(k.shape)[1:] == (k.shape[1] // shards, k.shape[2] // tensor)
    assert mlp.sharding.shard_shape(mlp.shape)[2] == mlp.shape[2] // tensor


def test_ulysses_ring_on_context4_x_tensor2_equals_one_device(model, inputs, single):
    mesh_kw = {"context": 4, "tensor": 2}
    tr = ditax.load_transformer(model[1], mesh=make_mesh(mesh_kw), attention=AttentionConfig(
        backend="ulysses_ring", local="xla", ulysses_shards=2))
    _check_sharded(tr, mesh_kw)
    out = np.asarray(tr(**inputs))
    assert rel_err(out, single) <= 1e-5, rel_err(out, single)


def test_ring_on_fsdp2_x_context4_forward_and_gradient(model, inputs, single):
    """The ring forward (blockwise steps) with batch and parameters sharded (fsdp) and the
    joint sequence over 4 context shards equals one device; its parameter gradient equals
    torch autograd's on one device (one compiled program)."""
    import torch

    from ditax.io.convert import export
    from ditax.models.flux.convert import weight_table

    m, folder = model
    mesh_kw = {"fsdp": 2, "context": 4}
    tr = ditax.load_transformer(folder, mesh=make_mesh(mesh_kw), attention=AttentionConfig(
        backend="ring", local="blockwise", block_kv=8))
    _check_sharded(tr, mesh_kw)

    @jax.jit
    def out_and_grads(tr):
        out, pull = jax.vjp(lambda tr: tr(**inputs), tr)
        return out, pull(2 * out / out.size)[0]              # d mean(out²) / d params

    out, grads = out_and_grads(tr)
    assert rel_err(out, single) <= 1e-5, rel_err(out, single)
    ours = export(weight_table(tr.config), grads._state)
    m.zero_grad()
    ref = m(**{k: torch.from_numpy(v) for k, v in inputs.items()}, return_dict=False)[0]
    (ref ** 2).mean().backward()
    keys = sorted(ours)
    flat = [np.concatenate([np.ravel(g[k]) for k in keys])
            for g in (ours, {k: p.grad.numpy() for k, p in m.named_parameters()})]
    assert rel_err(flat[0], flat[1]) <= 1e-5, rel_err(flat[0], flat[1])


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
