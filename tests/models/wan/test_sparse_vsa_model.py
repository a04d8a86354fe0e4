"""VSA in the Wan transformer (``attention.sparsity=vsa attention.topk=K``, issue 58 item 3):
the self-attention layers carry the coarse branch's gate (``to_gate_compress``, zero at init;
left zero when a dense checkpoint is loaded), the model equals its blocks run with the dense
VSA reference, every tile picked with the gate at zero is the dense model, and the keys are
checked in one line."""

from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np
import pytest
from flax import nnx

from ditax.attention.sparse.vsa import VsaCall, vsa_reference
from ditax.config import AttentionConfig, ModelConfig
from ditax.models.wan.build import init_model
from sparse_reference import config_refusal

CFG = ModelConfig(num_attention_heads=2, attention_head_dim=16, ffn_dim=48, num_layers=1,
                  in_channels=4, out_channels=4, text_dim=24, freq_dim=16)
VSA = AttentionConfig(backend="xla", sparsity="vsa", tile=(1, 2, 2), topk=2)


def _inputs(rng, f=2, y=6, x=6, b=1):
    lat = rng.standard_normal((b, 4, f, y, x)).astype(np.float32)
    t = rng.uniform(0, 1000, size=(b,)).astype(np.float32)
    return lat, t, rng.standard_normal((b, 7, 24)).astype(np.float32)


def _gates(model):
    return model.blocks.attn1.to_gate_compress


class ReferenceCall(VsaCall):
    def __call__(self, q, k, v, *, kv_mask=None, scale=None, head_major=False, gate=None):
        return vsa_reference(q, k, v, gate, tile_len=self.tile_len, topk=self.topk,
                             kv_mask=kv_mask, scale=scale)


@pytest.mark.parametrize("backend, tile", [("xla", (1, 2, 2)), ("flash", (2, 2, 2))])
def test_gated_model_equals_its_blocks_with_the_reference(backend, tile, rng):
    """Grid 2 x 3 x 3 in 1 x 2 x 2 tiles (padded rows and columns): 2 x 2 x 2 = 8 tiles, 2
    picked (flash, the fine stage on the interpreted kernel: 2 x 2 x 2 tiles, 4 of them); a
    random gate so both branches count."""
    acfg = dataclasses.replace(VSA, backend=backend, tile=tile)
    n = tile[0] * tile[1] * tile[2]
    model = init_model(CFG, acfg, seed=4)
    g = _gates(model)
    g.kernel[...] = 0.3 * jax.random.normal(jax.random.key(1), g.kernel[...].shape)
    graphdef, state = nnx.split(model)

    @functools.partial(jax.jit, static_argnums=4)
    def forward(state, lat, t, text, reference: bool):
        m = nnx.merge(graphdef, state)
        h, ctx = m.embed(lat, t, text)
        call = ctx.plan(m.attention_plan).self_attn
        assert isinstance(call, VsaCall) and (call.tile_len, call.topk) == (n, 2)
        assert call.backend == backend
        if reference:    # the blocks with the dense reference (tokens stay tile-major)
            m.attention_plan = dataclasses.replace(m.attention_plan,
                                                   self_attn=ReferenceCall(n, 2))
            return m.head(m.run_blocks(h, ctx._replace(tiles=None)), ctx)
        return m.head(m.run_blocks(h, ctx), ctx)

    lat, t, text = _inputs(rng)
    got, want = (np.asarray(forward(state, lat, t, text, r)) for r in (False, True))
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)


def test_every_tile_with_the_gate_at_init_is_the_dense_model(rng):
    dense = init_model(CFG, AttentionConfig(backend="xla"), seed=2)
    vsa = init_model(CFG, dataclasses.replace(VSA, topk=8), seed=0)
    g = _gates(vsa)
    assert not np.asarray(g.kernel[...]).any() and not np.asarray(g.bias[...]).any()
    nnx.update(vsa, nnx.state(dense))
    lat, t, text = _inputs(rng)
    run = nnx.jit(lambda m, *a: m(*a))
    np.testing.assert_allclose(np.asarray(run(vsa, lat, t, text)),
                               np.asarray(run(dense, lat, t, text)), rtol=1e-5, atol=2e-5)


def test_the_gates_at_zero_get_gradients(rng):
    """At init (gates zero: the coarse branch off) a loss still reaches the gates' kernels
    and biases through ``g_c * o_c``."""
    model = init_model(CFG, VSA, seed=1)
    lat, t, text = _inputs(rng)
    grads = nnx.jit(nnx.grad(lambda m: (m(lat, t, text) ** 2).mean()))(model)
    g = _gates(grads)
    for leaf in (g.kernel[...], g.bias[...]):
        assert np.isfinite(np.asarray(leaf)).all() and np.abs(np.asarray(leaf)).max() > 0


def test_a_dense_checkpoint_loads_with_the_gates_at_zero():
    import ditax

    path = ditax.demo.model_path()
    acfg = AttentionConfig(backend="xla", sparsity="vsa", tile=(1, 2, 2), topk=3)
    vsa = ditax.load_transformer(path, attention=acfg).module
    dense = ditax.load_transformer(path).module
    g = _gates(vsa)
    assert g.kernel[...].shape == (4, 320, 320) and not np.asarray(g.kernel[...]).any()
    assert not np.asarray(g.bias[...]).any()
    np.testing.assert_array_equal(np.asarray(vsa.blocks.attn1.to_q.kernel[...]),
                                  np.asarray(dense.blocks.attn1.to_q.kernel[...]))
    assert not hasattr(dense.blocks.attn1, "to_gate_compress")


def test_trained_gates_are_written_and_read_back(tmp_path):
    """A gated model's table writes the gates (diffusers names); the folder loads back gated
    with them, and a dense load refuses it (its gate keys are unexpected)."""
    import json

    import ditax
    from ditax.errors import WeightError
    from ditax.io.export import save_folder
    from ditax.models.wan.convert import config_weight_table

    path = ditax.demo.model_path()
    acfg = AttentionConfig(backend="xla", sparsity="vsa", tile=(1, 2, 2), topk=3)
    vsa = ditax.load_transformer(path, attention=acfg).module
    g = _gates(vsa)
    g.bias[...] = jax.random.normal(jax.random.key(0), g.bias[...].shape)
    config = json.loads((path / "transformer" / "config.json").read_text())
    save_folder(tmp_path, "diffusion_pytorch_model.safetensors",
                config_weight_table(vsa.cfg, gated=True), nnx.to_pure_dict(nnx.state(vsa)),
                config)
    back = ditax.load_transformer(tmp_path, attention=acfg).module
    np.testing.assert_array_equal(np.asarray(_gates(back).bias[...]), np.asarray(g.bias[...]))
    with pytest.raises(WeightError, match="unexpected 8 key.*to_gate_compress"):
        ditax.load_transformer(tmp_path)


@pytest.mark.parametrize("overrides, words", [
    (["attention.sparsity=vsa"], "attention.topk=0: attention.sparsity=vsa needs"),
    (["attention.backend=splash", "attention.sparsity=vsa", "attention.topk=2"],
     "attention.backend=splash takes no per-query-tile table yet; set attention.backend=xla "
     "or flash"),
    (["attention.backend=splash", "attention.sparsity=radial", "attention.topk=2"],
     "attention.topk=2 applies to attention.sparsity=vsa only"),
    (["attention.sparsity=vsa", "attention.topk=2", "mesh.context=2"],
     "attention.sparsity=vsa with sequence parallelism (mesh.context=2) runs on "
     "attention.backend=ulysses (each device's heads whole"),
])
def test_the_vsa_keys_are_checked(overrides, words):
    message = config_refusal(overrides)
    assert words in message, message


def test_auto_and_xla_take_vsa():
    from ditax.config import load_config, validate

    for backend in ("auto", "xla"):
        validate(load_config("tiny", [f"attention.backend={backend}", "attention.sparsity=vsa",
                                      "attention.topk=2"]))


def test_topk_past_the_grid_tiles_is_refused():
    """Checked with the grid: when the model lays its tokens out (and when a plan counts)."""
    from ditax.attention.sparse.layout import sparse_layout
    from ditax.errors import ConfigError

    with pytest.raises(ConfigError, match=r"attention.topk=9 exceeds the 8 tiles of the "
                                          r"2x3x3 token grid .*attention.topk<=8"):
        sparse_layout(dataclasses.replace(VSA, topk=9), (2, 3, 3))
