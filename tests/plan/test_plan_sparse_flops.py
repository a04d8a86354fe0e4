"""``ditax plan``'s FLOP count under ``attention.sparsity`` (issue 58): the self-attention's
scores and values (``4 L² D`` a block, dense) count only the share its block table keeps, so a
sparse model's forward counts ``layers · 4 L² D · (1 - density)`` fewer FLOPs than the dense
one's; ``full`` counts as dense."""

from __future__ import annotations

import json

from ditax.attention.sparse.layout import attention_density
from ditax.cli import main
from ditax.config import load_config
from ditax.models.base import model_family

RADIAL = ["attention.backend=splash", "attention.sparsity=radial", "attention.tile=1,8,8"]


def _flops(overrides, shape=(16, 21, 60, 104)):
    cfg = load_config("wan2.1-t2v-1.3b", overrides)
    return model_family(cfg.model, cfg.attention).flops_per_sample(shape, 512) / 3, cfg


def test_the_sparse_forward_counts_the_kept_blocks_only():
    """Wan 1.3B at 480p x 81: dense 283 TFLOP a forward, of which 198 the attention core; a
    radial table over 1 x 8 x 8 tiles removes that core's skipped share exactly."""
    dense, cfg = _flops([])
    assert round(dense / 1e12) == 283
    sparse, scfg = _flops(RADIAL)
    m = cfg.model
    L, D = 21 * 30 * 52, m.inner_dim
    rho = attention_density(scfg.attention, (21, 30, 52))
    assert 0 < rho < 0.75
    assert abs((dense - sparse) - m.num_layers * 4 * L * L * D * (1 - rho)) < 1e-6 * dense
    assert round(m.num_layers * 4 * L * L * D / 1e12) == 198
    full, _ = _flops(["attention.backend=splash", "attention.sparsity=full"])
    assert full == dense


def _plan(capsys, *overrides):
    rc = main(["plan", "tiny", "--target", "cpu:1", "--compile", "--json", "--latent", "6,8,8",
               *overrides])
    out = capsys.readouterr().out
    assert rc == 0
    return json.loads(out)["forward"]


def test_plan_reports_the_sparse_model_flops(capsys):
    dense = _plan(capsys, "attention.backend=splash")
    sparse = _plan(capsys, "attention.backend=splash", "attention.sparsity=radial",
                   "attention.tile=1,2,2")
    b, _, f, y, x = dense["latent"]
    cfg = load_config("tiny", [])
    pt, ph, pw = cfg.model.patch_size
    grid = (f // pt, y // ph, x // pw)
    L = grid[0] * grid[1] * grid[2]
    rho = attention_density(load_config("tiny", RADIAL[:2] + ["attention.tile=1,2,2"]).attention,
                            grid)
    assert 0 < rho < 1
    removed = cfg.model.num_layers * 4 * L * L * cfg.model.inner_dim * (1 - rho) * b
    assert abs(dense["model_flops"] - sparse["model_flops"] - removed) < 1e-6 * removed


def test_vsa_counts_its_top_k_tiles_pooled_pass_and_gate():
    """VSA at 480p x 81 in 4 x 8 x 8 tiles (6 x 4 x 7 = 168 tiles, the grid padded), 21 of
    them picked: the attention core counts 21 / 168 plus the pooled pass's 1 / 256², and the
    gate's projection 2·L·D² a block."""
    from ditax.attention.sparse.vsa import vsa_density

    dense, cfg = _flops([])
    vsa, vcfg = _flops(["attention.sparsity=vsa", "attention.topk=21"])
    m = cfg.model
    L, D = 21 * 30 * 52, m.inner_dim
    rho = attention_density(vcfg.attention, (21, 30, 52))
    assert rho == vsa_density(168, 256, 21) == 0.125 + 1 / 256 ** 2
    core = m.num_layers * 4 * L * L * D
    assert abs((dense - vsa) - (core * (1 - rho) - m.num_layers * 2 * L * D * D)) < 1e-6 * dense


def test_plan_shows_the_tile_and_its_padding(capsys):
    """``ditax plan`` (no compile) at Wan 1.3B's 480p x 81 (the preset's sample): one line
    with the tile ``auto`` chose and the tokens padded to whole tiles, the same in ``--json``;
    the default 4 x 8 x 8 pads by 31%."""
    over = ["attention.backend=splash", "attention.sparsity=sliding_tile"]
    assert main(["plan", "wan2.1-t2v-1.3b", "--target", "cpu:1", *over,
                 "attention.tile=auto"]) == 0
    lines = [s for s in capsys.readouterr().out.splitlines() if s.startswith("sparsity")]
    assert lines == ["sparsity sliding_tile: 21x30x52 tokens in 3x32x4 tiles (384 tokens, "
                     "attention.tile=auto): 34,944 tokens for 32,760 (+6.7% padding), 8.5% of "
                     "the scores"], lines
    assert main(["plan", "wan2.1-t2v-1.3b", "--target", "cpu:1", "--json", *over]) == 0
    s = json.loads(capsys.readouterr().out)["sparsity"]
    assert (s["tile"], s["tile_auto"], s["padded_tokens"], round(s["padding"], 3)) == (
        [4, 8, 8], False, 43008, 0.313)
