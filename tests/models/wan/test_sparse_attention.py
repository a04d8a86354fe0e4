"""Block-sparse self-attention in the Wan transformer (issue 58, ``attention.sparsity``): the
video tokens tile-major between embedding and head, RoPE and per-token terms permuted with
them, padding keys masked. ``full`` equals the dense model (same weights); ``sliding_tile``
equals the same blocks with a dense reference attention that applies the layout's token mask
(interpreted splash on CPU, float32)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ditax.attention.sparse.layout import reference_mask, sparse_layout
from ditax.attention.sparse.masks import density
from ditax.config import AttentionConfig, ModelConfig
from ditax.models.wan.build import init_model
from sparse_reference import config_refusal

CFG = ModelConfig(num_attention_heads=2, attention_head_dim=16, ffn_dim=48, num_layers=2,
                  in_channels=4, out_channels=4, text_dim=24, freq_dim=16)


def _inputs(rng, f, y, x, b=2, per_token=False):
    lat = rng.standard_normal((b, 4, f, y, x)).astype(np.float32)
    shape = (b, f * (y // 2) * (x // 2)) if per_token else (b,)
    t = rng.uniform(0, 1000, size=shape).astype(np.float32)
    text = rng.standard_normal((b, 7, 24)).astype(np.float32)
    return lat, t, text


@pytest.mark.parametrize("tile, latent, per_token", [
    ((2, 2, 4), (3, 6, 10), False),      # grid 3x3x5 in 2x2x4 tiles: padded on every axis
    ((1, 2, 2), (2, 8, 6), True),        # per-token timesteps (TI2V) follow their tokens
])
def test_full_sparsity_equals_the_dense_model(tile, latent, per_token, rng):
    lat, t, text = _inputs(rng, *latent, per_token=per_token)
    sparse = init_model(CFG, AttentionConfig(backend="splash", sparsity="full", tile=tile),
                        seed=3)
    h, ctx = sparse.embed(lat, t, text)
    order = ctx.tiles.order
    assert h.shape[1] == order.length > ctx.seq and ctx.token_mask is not None
    got = np.asarray(sparse(lat, t, text))
    for dense in ("splash", "xla"):
        want = np.asarray(init_model(CFG, AttentionConfig(backend=dense), seed=3)(lat, t, text))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-5)


class MaskedReference:
    """Dense float32 attention with a fixed ``[L', L']`` token mask (and the kv mask): the
    reference a block table must reproduce; token-major like the ``xla`` call."""

    reads_head_major = False

    def __init__(self, mask):
        self.mask = jnp.asarray(mask)

    def __call__(self, q, k, v, *, kv_mask=None, scale=None, head_major=False):
        assert not head_major
        keep = self.mask[None] if kv_mask is None else self.mask[None] & kv_mask[:, None, :]
        s = jnp.einsum("blnk,btnk->bnlt", q, k) * (q.shape[-1] ** -0.5)
        s = jnp.where(keep[:, None], s, -jnp.inf)
        return jnp.einsum("bnlt,btnk->blnk", jax.nn.softmax(s, axis=-1), v)


def masked_reference_output(model, h, ctx):
    """``model``'s output from the embedded ``h, ctx`` with its self-attention replaced by
    dense attention under the tile layout's token mask (the plan restored after)."""
    plan = model.attention_plan
    model.attention_plan = dataclasses.replace(
        plan, self_attn=MaskedReference(reference_mask(ctx.tiles)))
    try:
        return np.asarray(model.head(model.run_blocks(h, ctx._replace(tiles=None)), ctx))
    finally:
        model.attention_plan = plan


@pytest.mark.parametrize("window", [(3, 1, 1), (1, 3, 3)])
def test_sliding_tile_equals_the_masked_dense_reference(window, rng):
    """128-token tiles (each one kernel block, kept or skipped whole) on a grid whose rows do
    not divide by the tile: the model's output equals its blocks run with dense attention
    under the layout's token mask, and differs from the dense model's (blocks were skipped)."""
    acfg = AttentionConfig(backend="splash", sparsity="sliding_tile", tile=(1, 4, 32),
                           window=window)
    lat, t, text = _inputs(rng, 3, 14, 64, b=1)     # grid 3 x 7 x 32: 3 x 2 x 1 tiles
    model = init_model(CFG, acfg, seed=5)
    h, ctx = model.embed(lat, t, text)
    layout = ctx.tiles
    assert layout.order.tiles == (3, 2, 1) and 0 < density(layout.table.table) < 1
    call = ctx.plan(model.attention_plan).self_attn
    assert call.options.block_table == layout.table
    assert call.options.block_q == call.options.block_kv == 128
    got = np.asarray(model.head(model.run_blocks(h, ctx), ctx))

    want = masked_reference_output(model, h, ctx)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)

    dense = np.asarray(init_model(CFG, AttentionConfig(backend="xla"), seed=5)(lat, t, text))
    assert np.abs(got - dense).max() > 1e-3


def test_layout_round_trip_keeps_every_token_and_its_rope(rng):
    """The permutation is exact both ways, and every tile-major token carries the RoPE row
    of its own frame-major position."""
    from ditax.models.wan.embeddings import rope_cos_sin

    acfg = AttentionConfig(backend="splash", sparsity="sliding_tile", tile=(2, 2, 4))
    layout = sparse_layout(acfg, (3, 5, 7))
    assert layout is sparse_layout(acfg, (3, 5, 7))          # built once per grid
    x = jnp.asarray(rng.standard_normal((2, 105, 8)), jnp.float32)
    np.testing.assert_array_equal(np.asarray(layout.from_tiles(layout.to_tiles(x))),
                                  np.asarray(x))
    cos, _ = rope_cos_sin(16, (3, 5, 7))
    tiled = np.asarray(layout.to_tiles(cos, 0))
    src = layout.order.source
    np.testing.assert_array_equal(tiled[src >= 0], np.asarray(cos)[src[src >= 0]])
    assert sparse_layout(AttentionConfig(), (3, 5, 7)) is None


def test_vace_control_tokens_follow_the_layout(rng):
    """A VACE model's control tokens and hints are laid out with the video tokens: ``full``
    equals the dense VACE model (control shorter than the latents, grid padded)."""
    from ditax.models.wan.vace_family import init_model as init_vace

    cfg = dataclasses.replace(CFG, num_layers=3, vace_layers=(0, 2), vace_in_channels=6)
    lat, t, text = _inputs(rng, 3, 6, 10)
    ctrl = rng.standard_normal((2, 6, 2, 6, 10)).astype(np.float32)
    scale = np.asarray([0.7, 1.3], np.float32)
    outs = [np.asarray(init_vace(cfg, a, seed=2)(lat, t, text, control_hidden_states=ctrl,
                                                 control_hidden_states_scale=scale))
            for a in (AttentionConfig(backend="splash", sparsity="full", tile=(2, 2, 4)),
                      AttentionConfig(backend="xla"))]
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("overrides, words", [
    (["attention.sparsity=full"], "attention.sparsity=full needs attention.backend=splash"),
    (["attention.backend=flash", "attention.sparsity=sliding_tile", "attention.tile=1,2,2"],
     "attention.tile=1,2,2 holds 4 tokens; flash's blocks lie inside one tile"),
    (["attention.backend=splash", "attention.sparsity=full", "mesh.context=2"],
     "with sequence parallelism (mesh.context=2) runs on attention.backend=ulysses, ring or "
     "ulysses_ring"),
    (["attention.backend=splash", "attention.sparsity=sliding_tile", "attention.window=2,3,3"],
     "attention.window=2,3,3 must be odd spans"),
    (["attention.backend=splash", "attention.sparsity=full", "attention.tile=4,0,8"],
     "attention.tile=4,0,8 must be three ints >= 1"),
    (["attention.sparsity=radial"], "attention.sparsity"),
    (["attention.backend=splash", "attention.sparsity=full", "attention.tile=autox"],
     "attention.tile='autox': expected a list of 3 values like 1,2,2 or auto"),
    (["attention.backend=splash", "attention.sparsity=full", "attention.tile=4,8"],
     "attention.tile='4,8': expected a list of 3 values like 1,2,2 or auto"),
])
def test_the_config_refuses_what_no_kernel_honours(overrides, words):
    message = config_refusal(overrides)
    assert words in message, message


@pytest.mark.parametrize("preset", ["flux-tiny", "wan2.2-animate-14b"])
def test_families_that_do_not_lay_tokens_out_refuse_sparsity(preset):
    from ditax.config import load_config, validate
    from ditax.errors import ConfigError

    with pytest.raises(ConfigError, match=r"wired for the Wan text-/image-to-video and VACE "
                                          r"transformers only.*use attention.sparsity=none"):
        validate(load_config(preset, ["attention.backend=splash", "attention.sparsity=full"]))


@pytest.mark.parametrize("tile, ran", [("2,4,4", [2, 4, 4]), ("auto", [4, 8, 12])])
def test_bench_runs_sparse_and_names_it(tile, ran, capsys):
    """The row names the tile that ran (``auto``: the grid 3 x 6 x 10's, one 384-token
    tile)."""
    import json

    from ditax.cli import main

    rc = main(["bench", "tiny", "--latent", "3,12,20", "--text-len", "8", "--repeats", "1",
               "--no-progress", "attention.backend=splash", "attention.sparsity=sliding_tile",
               f"attention.tile={tile}", "attention.window=1,3,3"])
    out = capsys.readouterr().out
    assert rc == 0, out
    row = json.loads(out.strip().splitlines()[-1])
    assert row["attention"] == "splash" and row["sparsity"] == {
        "mode": "sliding_tile", "tile": ran, "window": [1, 3, 3]}


def test_auto_tile_pads_least_says_so_and_equals_the_masked_reference(rng, caplog):
    """``attention.tile=auto`` on a 3 x 7 x 32 grid: 3 x 8 x 16 tiles (384 tokens, one kernel
    block each; 768 tokens where 4 x 8 x 8 would lay out 1,024), said in one info line; the
    model's output equals its blocks under dense attention with the layout's token mask. VSA
    on the table kernels takes at most 512-token tiles."""
    import logging

    from ditax.attention.sparse import layout as layout_mod

    acfg = AttentionConfig(backend="splash", sparsity="sliding_tile", tile="auto",
                           window=(1, 1, 1))
    layout_mod._auto_tile.cache_clear()
    with caplog.at_level(logging.INFO, logger="ditax.attention.sparse.layout"):
        lat, t, text = _inputs(rng, 3, 14, 64, b=1)
        model = init_model(CFG, acfg, seed=5)
        h, ctx = model.embed(lat, t, text)
    said = [r.getMessage() for r in caplog.records if "attention.tile=auto" in r.getMessage()]
    assert said == ["attention.tile=auto: 3x7x32 in 3x8x16 tiles (384 tokens): 768 tokens for "
                    "672 (+14.3%) (the default 4x8x8: 1,024 tokens)"], said
    layout = ctx.tiles
    assert layout.order.tile == (3, 8, 16) and 0 < density(layout.table.table) < 1
    call = ctx.plan(model.attention_plan).self_attn   # CPU: interpret's 128 blocks, in a tile
    assert call.options.block_table == layout.table and 384 % call.options.block_q == 0
    got = np.asarray(model.head(model.run_blocks(h, ctx), ctx))
    np.testing.assert_allclose(got, masked_reference_output(model, h, ctx), rtol=0, atol=2e-5)
    vsa = AttentionConfig(backend="flash", sparsity="vsa", topk=1, vsa_fine="table",
                          tile="auto")
    assert sparse_layout(vsa, (1, 1, 1000)).order.tile_len <= 512


def test_unset_kernel_blocks_become_one_tile_on_a_tpu():
    """Targeting a TPU (blocks unset: the tuning table's otherwise) a lane-multiple tile is
    the kernel's query and key block, so each block is kept or skipped whole; given blocks
    stay."""
    import ditax
    from ditax.models.wan.build import abstract_model

    for given, want, tile in ((None, 256, (4, 8, 8)), (512, 512, (4, 8, 8)),
                              (None, 384, "auto")):     # auto: 3 x 32 x 4, 384 tokens
        acfg = AttentionConfig(backend="splash", sparsity="sliding_tile", block_q=given,
                               block_kv=given, tile=tile)
        with ditax.target_platform("tpu"):
            plan = abstract_model(CFG, acfg).attention_plan
        call = sparse_layout(acfg, (21, 30, 52)).plan(plan).self_attn
        assert (call.options.block_q, call.options.block_kv) == (want, want)
        assert call.options.block_table.tile_len == (256 if tile != "auto" else 384)
        assert sparse_layout(acfg, (21, 30, 52)).plan(plan).cross_attn is plan.cross_attn
