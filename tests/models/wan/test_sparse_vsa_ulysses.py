"""VSA under Ulysses (``attention.sparsity=vsa attention.backend=ulysses``): after the
sequence→heads exchange each device runs the whole of VSA (pooled pass, picks, fine pass,
gate) on its heads. A small Wan on fsdp 2 x context 4 equals the one-device VSA model: jnp
fine stage on a padded grid (forward and the weights' gradients), flash over gathered tiles,
and the table kernels; a ring and a length that does not split over the shards are refused
in one line."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ditax.config import AttentionConfig, ConfigError, ModelConfig
from ditax.models.wan.build import init_model
from ditax.parallel import make_mesh
from sparse_reference import config_refusal

CFG = ModelConfig(num_attention_heads=4, attention_head_dim=16, ffn_dim=48, num_layers=2,
                  in_channels=4, out_channels=4, text_dim=24, freq_dim=16)
VSA = dict(sparsity="vsa", tile=(1, 2, 4), topk=3)


def _inputs(rng, y):
    return (rng.standard_normal((2, 4, 2, y, 16)).astype(np.float32),
            rng.uniform(0, 1000, (2,)).astype(np.float32),
            rng.standard_normal((2, 7, 24)).astype(np.float32))


def _open_gates(model, bias):
    """Set every layer's gate bias (zero at init) so the pooled branch counts."""
    g = model.blocks.attn1.to_gate_compress
    g.bias[...] = jax.device_put(bias, g.bias[...].sharding)


def _grads(model, inputs, w):
    from flax import nnx

    g = nnx.grad(lambda m: jnp.sum(m(*inputs) * w))(model)
    return [np.asarray(x) for x in jax.tree.leaves(nnx.state(g))]


@pytest.mark.parametrize("local, fine, y, grads", [
    pytest.param("xla", "gather", 10, True,   # grid 2 x 5 x 8 in 1 x 2 x 4 tiles: rows
                 marks=pytest.mark.slow),      # padded; with gradients (18 s)
    pytest.param("flash", "gather", 10, False, marks=pytest.mark.slow),   # 7 s
    ("flash", "table", 12, False),    # whole tiles
])
def test_vsa_under_ulysses_equals_one_device(local, fine, y, grads, rng):
    inputs = _inputs(rng, y)
    one = init_model(CFG, AttentionConfig(backend=local, vsa_fine=fine, **VSA), seed=3)
    bias = jax.random.normal(jax.random.key(0), one.blocks.attn1.to_gate_compress.bias[...].shape)
    _open_gates(one, bias)
    mesh = make_mesh({"fsdp": 2, "context": 4})
    uly = init_model(CFG, AttentionConfig(backend="ulysses", local=local, vsa_fine=fine, **VSA),
                     mesh=mesh, seed=3)
    _open_gates(uly, bias)
    h, ctx = uly.embed(*inputs)
    assert type(ctx.plan(uly.attention_plan).self_attn).__name__ == "UlyssesVsa"
    want = np.asarray(one(*inputs))
    got = np.asarray(uly(*inputs))
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max())
    dense = np.asarray(init_model(CFG, AttentionConfig(backend="xla"), seed=3)(*inputs))
    assert np.abs(got - dense).max() > 1e-3
    if grads:
        w = jnp.asarray(rng.standard_normal(inputs[0].shape).astype(np.float32))
        g_got, g_want = _grads(uly, inputs, w), _grads(one, inputs, w)
        assert len(g_got) == len(g_want) > 10
        for a, b in zip(g_got, g_want):
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5 * max(np.abs(b).max(), 1e-3))


@pytest.mark.parametrize("overrides, words", [
    (["attention.backend=ring", "attention.local=flash", "attention.sparsity=vsa",
      "attention.topk=2", "mesh.context=2"],
     "attention.backend=ring takes no per-query-tile table yet; set attention.backend=xla or "
     "flash (or ulysses with local=xla or flash)"),
    (["attention.backend=flash", "attention.sparsity=vsa", "attention.topk=2",
      "mesh.context=2"],
     "attention.sparsity=vsa with sequence parallelism (mesh.context=2) runs on "
     "attention.backend=ulysses"),
    (["attention.backend=ulysses", "attention.local=splash", "attention.sparsity=vsa",
      "attention.topk=2", "mesh.context=2"],
     "attention.backend=ulysses with local=splash takes no per-query-tile table yet"),
    (["attention.backend=ulysses", "attention.local=xla", "attention.sparsity=vsa",
      "attention.topk=2", "attention.vsa_fine=table", "mesh.context=2"],
     "attention.vsa_fine=table runs VSA's fine pass on ditax's Pallas table kernels, chosen "
     "with attention.backend=flash (is ulysses with local=xla)"),
])
def test_the_config_refuses_what_vsa_under_sequence_parallelism_does_not_run(overrides, words):
    message = config_refusal(overrides)
    assert words in message, message


def test_the_config_takes_vsa_under_ulysses():
    from ditax.config import load_config, validate

    validate(load_config("tiny", ["attention.backend=ulysses", "attention.local=flash",
                                  "attention.sparsity=vsa", "attention.topk=2",
                                  "mesh.context=2"]), num_devices=8)


def test_a_length_off_the_shards_is_refused(rng):
    """Grid 1 x 5 x 8 in 1 x 1 x 3 tiles: 15 tiles, 45 tile-major tokens on 4 shards."""
    lat = rng.standard_normal((2, 4, 1, 10, 16)).astype(np.float32)
    model = init_model(CFG, AttentionConfig(backend="ulysses", local="xla", sparsity="vsa",
                                            tile=(1, 1, 3), topk=2),
                       mesh=make_mesh({"fsdp": 2, "context": 4}), seed=3)
    with pytest.raises(ConfigError, match="45 tile-major tokens, which do not split over the "
                                          "4 context shards"):
        model(lat, *_inputs(rng, 10)[1:])


def test_vsa_under_ulysses_without_a_mesh_is_refused(rng):
    model = init_model(CFG, AttentionConfig(backend="ulysses", local="xla", **VSA), seed=3)
    with pytest.raises(ConfigError, match="needs a mesh with a context axis"):
        model(*_inputs(rng, 12))
