"""Radial block-sparse self-attention in the Wan transformer (``attention.sparsity=radial``):
the model's output equals its blocks run with dense attention under the layout's token mask
(interpreted splash and flash on CPU, float32), and the config's rules for the radial keys."""

from __future__ import annotations

import numpy as np
import pytest

from ditax.attention.sparse.masks import density
from ditax.config import AttentionConfig
from ditax.models.wan.build import init_model
from test_sparse_attention import CFG, _inputs, masked_reference_output  # noqa: E402


@pytest.mark.parametrize("backend", ["splash", "flash"])
def test_radial_equals_the_masked_dense_reference(backend, rng):
    """128-token tiles, 5 tile-frames of 2 tiles (rows padded): radial skips blocks (density
    < 1) and the model equals the masked reference (splash, or flash visiting the listed
    blocks); it differs from the dense model."""
    acfg = AttentionConfig(backend=backend, sparsity="radial", tile=(1, 4, 32), decay=0.5)
    lat, t, text = _inputs(rng, 5, 14, 64, b=1)      # grid 5 x 7 x 32: 5 x 2 x 1 tiles
    model = init_model(CFG, acfg, seed=4)
    h, ctx = model.embed(lat, t, text)
    layout = ctx.tiles
    assert layout.order.tiles == (5, 2, 1) and 0 < density(layout.table.table) < 1
    call = ctx.plan(model.attention_plan).self_attn
    assert call.options.block_table == layout.table and call.options.block_q == 128
    got = np.asarray(model.head(model.run_blocks(h, ctx), ctx))
    want = masked_reference_output(model, h, ctx)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)
    dense = np.asarray(init_model(CFG, AttentionConfig(backend="xla"), seed=4)(lat, t, text))
    assert np.abs(got - dense).max() > 1e-3


@pytest.mark.parametrize("overrides, words", [
    (["attention.sparsity=radial", "attention.decay=0"], "attention.decay=0.0 must be a number > 0"),
    (["attention.sparsity=sliding_tile", "attention.decay=0.5"],
     "attention.decay=0.5 applies to attention.sparsity=radial only"),
    (["attention.sparsity=radial", "attention.window=1,1,1"],
     "attention.window=1,1,1 applies to attention.sparsity=sliding_tile only"),
    (["attention.sparsity=radial", "attention.dense_steps=-1"],
     "attention.dense_steps=-1 must be an int >= 0"),
    (["attention.backend=flash", "attention.sparsity=radial", "attention.block_q=512"],
     "attention.block_q=512 does not divide the 256-token tile"),
    (["attention.sparsity=none", "attention.dense_steps=2"],
     "attention.dense_steps=2 schedules block-sparse attention, but attention.sparsity=none"),
])
def test_the_radial_keys_are_checked(overrides, words):
    from ditax.config import load_config, validate
    from ditax.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        validate(load_config("tiny", ["attention.backend=splash", *overrides]), num_devices=8)
    assert words in str(e.value) and "\n" not in str(e.value), str(e.value)
    ok = load_config("tiny", ["attention.backend=splash", "attention.sparsity=radial",
                              "attention.decay=0.25", "attention.dense_steps=3"])
    validate(ok, num_devices=8)
    assert (ok.attention.decay, ok.attention.dense_steps) == (0.25, 3)
