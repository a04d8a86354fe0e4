"""``model.causal_chunk`` / ``sample.context_chunks`` in a config (issue 59 item 1): a model
built from a causal config runs block-causal in its own forward (= the dense masked oracle,
while the same weights without the field run bidirectionally); the field goes into
config.json and back; bad values are refused in one line naming the key."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ditax.config import ConfigError, load_config, validate
from ditax.models.wan.build import init_model
from ditax.models.wan.causal import causal_forward
from ditax.models.wan.config import WanConfig

TINY = ["model.num_attention_heads=2", "model.attention_head_dim=16", "model.ffn_dim=48",
        "model.num_layers=2", "model.in_channels=4", "model.out_channels=4",
        "model.text_dim=24", "model.freq_dim=16"]


def _config(*extra):
    return validate(load_config(None, TINY + list(extra)))


def test_causal_config_builds_a_block_causal_forward(rng):
    cfg = _config("model.causal_chunk=2", "sample.context_chunks=1")
    assert cfg.model.causal_chunk == 2 and cfg.sample.context_chunks == 1
    model = init_model(cfg.model, cfg.attention, seed=5)
    lat = rng.standard_normal((1, 4, 5, 4, 6)).astype(np.float32)     # chunks 2, 2, 1
    t = np.float32([700.0])
    text = rng.standard_normal((1, 7, 24)).astype(np.float32)
    got = np.asarray(model(lat, t, text))
    want = np.asarray(causal_forward(model, lat, t, text, chunk=2, reference=True))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # the same weights without the field: bidirectional (the first chunk sees later frames)
    bidir = init_model(dataclasses.replace(cfg.model, causal_chunk=None), cfg.attention, seed=5)
    full = np.asarray(bidir(lat, t, text))
    assert np.abs(full[:, :, :2] - got[:, :, :2]).max() > 1e-3


def test_causal_chunk_round_trips_through_config_json():
    m = WanConfig(causal_chunk=3)
    assert m.to_diffusers()["causal_chunk"] == 3
    assert WanConfig.from_diffusers(m.to_diffusers()).causal_chunk == 3
    assert "causal_chunk" not in WanConfig().to_diffusers()      # diffusers' own keys only


@pytest.mark.parametrize("extra, words", [
    (["model.causal_chunk=0"], ["model.causal_chunk=0", "positive"]),
    (["model.causal_chunk=3", "model.patch_size=[2,2,2]"], ["multiple of the temporal patch"]),
    (["model.causal_chunk=2", "attention.sparsity=radial"], ["attention.sparsity=none"]),
    (["model.causal_chunk=2", "model.image_dim=32", "model.added_kv_proj_dim=32"],
     ["text-to-video", "model.causal_chunk=none"]),
    (["model.causal_chunk=2", "sample.context_chunks=0"], ["sample.context_chunks=0", ">= 1"]),
    (["sample.context_chunks=2"], ["causal model", "model.causal_chunk"]),
])
def test_bad_causal_values_refused_in_one_line(extra, words):
    with pytest.raises(ConfigError) as e:
        _config(*extra)
    msg = str(e.value)
    assert "\n" not in msg, msg
    for w in words:
        assert w in msg, msg
