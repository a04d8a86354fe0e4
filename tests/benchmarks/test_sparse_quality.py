"""``benchmarks/sparse_quality.py``: its densities are the kept fractions of the masks the
model runs, its grid is the demo's, the paired score and PSNR arithmetic, and a smoke run
(one prompt, two steps) whose dense case is identical to itself and whose VSA case is not."""

from __future__ import annotations

import json
import math
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
import sparse_quality as sq  # noqa: E402


def test_the_grid_is_the_demo_models_token_grid():
    import ditax
    from ditax.demo import SAMPLE

    folder = ditax.demo.model_path()
    vae = json.loads((folder / "vae" / "config.json").read_text())
    patch = json.loads((folder / "transformer" / "config.json").read_text())["patch_size"]
    latent = ((SAMPLE["num_frames"] - 1) // vae["scale_factor_temporal"] + 1,
              SAMPLE["height"] // vae["scale_factor_spatial"],
              SAMPLE["width"] // vae["scale_factor_spatial"])
    assert sq.GRID == tuple(n // p for n, p in zip(latent, patch))


def test_each_density_is_the_kept_fraction_of_its_mask():
    from ditax.attention.sparse.layout import sparse_layout
    from ditax.attention.sparse.masks import block_mask
    from ditax.attention.sparse.tiles import TileOrder

    order = TileOrder(sq.GRID, sq.TILE)
    seen = {}
    for case, settings, _ in sq.CASES:
        d = sq.case_density(settings)
        sparsity = settings.get("sparsity")
        if sparsity is None:
            assert d == 1.0
            continue
        if sparsity == "vsa":
            tiles = int(np.prod(order.tiles))
            assert d == settings["topk"] / tiles + 1 / order.tile_len ** 2
            assert d <= 0.5                    # the item's bound on the VSA model
            continue
        half = tuple((w - 1) // 2 for w in settings.get("window", (3, 3, 3)))
        blocks = block_mask(order, sparsity, half, settings.get("decay", 1.0))
        assert d == blocks.mean()
        # the table the model's layout builds is that mask
        table = sparse_layout(sq.attention_config(settings), sq.GRID).table.table
        np.testing.assert_array_equal(table, blocks)
        seen[case] = d
    assert seen["full_splash"] == 1.0
    sta = [seen[c] for c in seen if c.startswith("sta_")]
    assert len(set(sta)) == len(sta) and max(sta) < 0.6 and min(sta) < 0.2


def test_paired_score_and_psnr():
    p = sq.paired("1100", "1010")
    assert (p["gained"], p["lost"], p["vs_dense"]) == (1, 1, 0.0) and p["ci95"] > 0
    assert sq.paired("1111", "0000")["vs_dense"] == 100.0
    rng = np.random.default_rng(0)
    a = rng.uniform(size=(3, 4, 4, 3))
    assert sq.psnr(a, a) is None
    b = a + 0.01
    assert math.isclose(sq.psnr(b, a), 40.0, rel_tol=1e-9)


def test_smoke_run_summary_and_table(tmp_path, capsys):
    out = tmp_path / "rows.jsonl"
    import ditax

    # the "fine-tuned" dense folder is the demo model itself: its videos are the dense ones
    sq.main(["--seeds", "7", "--cases", "vsa_zero_gates,vsa_finetuned,dense_finetuned",
             "--dense-ft-folder", str(ditax.demo.model_path()), "--tag", "same",
             "--combos", "1", "--steps", "2", "--batch", "1", "--out", str(out)])
    rows = [json.loads(ln) for ln in out.read_text().splitlines()]
    seeds = {r["case"]: r for r in rows if r["metric"] == "seed_videos"}
    # dense always (the reference); vsa_finetuned skipped: no --vsa-folder given
    assert set(seeds) == {"dense", "vsa_zero_gates", "dense_finetuned_same"}
    assert seeds["dense_finetuned_same"]["psnr"] == [None]
    assert seeds["dense"]["psnr"] == [None]                    # itself: identical
    assert math.isfinite(seeds["vsa_zero_gates"]["psnr"][0])
    got = {(r["case"], r["metric"]): r for r in rows if r["metric"] != "seed_videos"}
    assert got[("vsa_zero_gates", "psnr_mean")]["value"] == seeds["vsa_zero_gates"]["psnr"][0]
    assert got[("vsa_zero_gates", "density")]["value"] == 0.4625
    assert ("dense", "vs_dense") not in got and ("vsa_zero_gates", "vs_dense") in got
    with open(out, "a") as f:                   # a second run's seed line of the same case
        f.write(json.dumps(dict(seeds["vsa_zero_gates"], psnr=[30.0])) + "\n")
    sq.main(["--summary", str(out)])            # seed lines, then summaries of the latest
    again = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert [r["metric"] for r in again[:4]] == ["seed_videos"] * 4
    assert {(r["case"], r["metric"]): r["value"] for r in again[3:]}[
        ("vsa_zero_gates", "psnr_mean")] == 30.0
    capsys.readouterr()
    sq.main(["--table", str(out)])
    table = capsys.readouterr().out.splitlines()
    assert len(table) == 5 and table[2].startswith("| dense | xla | 100% |")
    assert table[3].startswith("| vsa_zero_gates | sparsity=vsa, tile=1,2,2, topk=8 | 46% |")
    assert table[4].startswith("| dense_finetuned_same | xla | 100% |")
    assert "| +0.0 ± 0.0 (0 / 0) |" in table[4] and table[4].endswith("| identical |")
