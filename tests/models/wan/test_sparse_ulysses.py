"""Block-sparse self-attention under Ulysses (issue 58 item 1, sequence parallel): the
tile-major tokens sharded over ``context`` in whole tiles, so after the exchange each device
holds the whole sequence for its heads and the local kernel reads the block table as on one
device. The model on an fsdp 2 x context 4 mesh (Ulysses around interpreted splash, float32)
equals the same model on one device; what no path honours is refused in one line."""

import numpy as np
import pytest

from ditax.config import AttentionConfig, ConfigError, ModelConfig
from ditax.models.wan.build import init_model
from ditax.parallel import make_mesh

CFG = ModelConfig(num_attention_heads=4, attention_head_dim=16, ffn_dim=48, num_layers=2,
                  in_channels=4, out_channels=4, text_dim=24, freq_dim=16)
SPARSE = dict(sparsity="sliding_tile", tile=(1, 4, 32), window=(1, 3, 1))


def _inputs(rng, f, y, x, b=2):
    return (rng.standard_normal((b, 4, f, y, x)).astype(np.float32),
            rng.uniform(0, 1000, size=(b,)).astype(np.float32),
            rng.standard_normal((b, 7, 24)).astype(np.float32))


@pytest.mark.slow   # 9 s (radial under a ring with Ulysses inside stays fast: test_sparse_ring)
def test_sliding_tile_under_ulysses_equals_one_device(rng):
    """Grid 2 x 7 x 32 in 1 x 4 x 32 tiles (128 tokens, one splash block each; rows padded):
    2 x 2 x 1 = 4 tiles, one a context shard."""
    lat, t, text = _inputs(rng, 2, 14, 64)
    one = init_model(CFG, AttentionConfig(backend="splash", **SPARSE), seed=5)
    want = np.asarray(one(lat, t, text))
    mesh = make_mesh({"fsdp": 2, "context": 4})
    uly = init_model(CFG, AttentionConfig(backend="ulysses", local="splash", **SPARSE),
                     mesh=mesh, seed=5)
    h, ctx = uly.embed(lat, t, text)
    call = ctx.plan(uly.attention_plan).self_attn
    assert dict(call.options.local_options)["block_table"] == ctx.tiles.table
    assert (call.options.block_q, call.options.block_kv) == (128, 128)
    got = np.asarray(uly(lat, t, text))
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)
    dense = np.asarray(init_model(CFG, AttentionConfig(backend="xla"), seed=5)(lat, t, text))
    assert np.abs(got - dense).max() > 1e-3                       # blocks were skipped


def test_what_no_sequence_path_honours_is_refused(rng):
    """(A tile count that does not divide the shards is padded with whole masked tiles:
    ``test_sparse_ring.py``.)"""
    for acfg, words in ((AttentionConfig(backend="ring", local="xla", **SPARSE),
                         "backend=ring needs attention.local=splash or flash"),
                        (AttentionConfig(backend="ulysses", local="xla", **SPARSE),
                         "local=splash or flash")):
        with pytest.raises(ConfigError, match=words):
            init_model(CFG, acfg, mesh=make_mesh({"fsdp": 2, "context": 4}), seed=5)(
                *_inputs(rng, 2, 14, 64))


@pytest.mark.slow   # 18 s: the exchange path with every weight gradient
def test_ulysses_flash_chunked_runs_the_exchange_path_and_trains_alike(rng):
    """flash as the local kernel with ``out_a2a=chunked`` (which would take the shard-major
    kernel path, that reads no block table): the plan takes the exchange path and says why;
    forward and the weights' gradients equal one device's; ``shard_major`` is refused."""
    import jax
    import jax.numpy as jnp

    from ditax.attention.sequence import plan_sequence_parallel

    lat, t, text = _inputs(rng, 2, 14, 64)
    w = jnp.asarray(rng.standard_normal(lat.shape).astype(np.float32))
    one = init_model(CFG, AttentionConfig(backend="flash", **SPARSE), seed=5)
    mesh = make_mesh({"fsdp": 2, "context": 4})
    uly = init_model(CFG, AttentionConfig(backend="ulysses", local="flash", out_a2a="chunked",
                                          **SPARSE), mesh=mesh, seed=5)
    h, ctx = uly.embed(lat, t, text)
    call = ctx.plan(uly.attention_plan).self_attn
    sp = plan_sequence_parallel("ulysses", mesh, q_shape=(2, h.shape[1], 4, 16),
                                options=call.options)
    assert not sp.kernel_path and any("block table" in r for r in sp.reasons)
    assert sp.local.options.block_table == ctx.tiles.table

    def grad(model):     # the weights' gradients, every layer's attention backward in them
        from flax import nnx

        g = nnx.grad(lambda m: jnp.sum(m(lat, t, text) * w))(model)
        return [np.asarray(x) for x in jax.tree.leaves(nnx.state(g))]

    np.testing.assert_allclose(np.asarray(uly(lat, t, text)), np.asarray(one(lat, t, text)),
                               rtol=0, atol=2e-5)
    got, want = grad(uly), grad(one)
    assert len(got) == len(want) > 10
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    shard_major = init_model(CFG, AttentionConfig(backend="ulysses", local="flash",
                                                  out_a2a="shard_major", **SPARSE),
                             mesh=mesh, seed=5)
    with pytest.raises(ConfigError, match="out_a2a=flat or chunked"):
        shard_major(lat, t, text)


def test_the_config_takes_ulysses_with_a_sparsity():
    from ditax.config import load_config, validate

    validate(load_config("tiny", ["attention.backend=ulysses", "attention.local=splash",
                                  "attention.sparsity=sliding_tile", "mesh.context=2"]),
             num_devices=8)
