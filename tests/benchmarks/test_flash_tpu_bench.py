"""``benchmarks/flash_tpu.py --chip`` off a TPU: the same cases in interpret mode at a tiny
shape (so the chip's call does not die on a typo), the budget guard, and a misspelt variant
refused in one line before anything compiles."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
import flash_tpu  # noqa: E402


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_chip_mode_runs_interpreted_with_ratios_and_the_fastest_variant_backward(tmp_path):
    out = tmp_path / "rows.jsonl"
    flash_tpu.main(["--chip", "--variants", "plain,all", "--repeats", "1", "--budget-s", "120",
                    "--out", str(out)])
    rows = _rows(out)
    got = {(r["variant"], r["direction"], r["layout"]): r for r in rows}
    every = "unroll+lanes+prescale+pv_f32"
    assert set(got) == {(None, "fwd", None), ("plain", "fwd", "packed"),
                        (every, "fwd", "packed"), ("plain", "fwd", "head_major"),
                        (every, "fwd", "head_major"), (None, "fwd+bwd", None),
                        ("plain", "fwd+bwd", "packed"), (every, "fwd+bwd", "packed")}
    assert all(r["interpret"] and r["metric"] == "time" and r["value"] > 0 for r in rows)
    a = got[(every, "fwd", "packed")]
    assert a["ratio"] == pytest.approx(a["value"] / got[(None, "fwd", None)]["value"], rel=1e-3)
    assert 0 < a["max_abs_diff_vs_plain"] < 0.05          # bf16: q rounded after scaling
    # the head-major input: the same kernel, the same values (transposed back)
    assert got[("plain", "fwd", "head_major")]["max_abs_diff_vs_plain"] == 0.0


def test_budget_and_a_misspelt_variant(tmp_path, capsys):
    with pytest.raises(SystemExit, match=r"^flash_tpu.py --variants: flash kernel variant "
                                         r"'unrol': unknown flag"):
        flash_tpu.main(["--chip", "--variants", "plain,unrol"])
    out = tmp_path / "rows.jsonl"
    flash_tpu.main(["--chip", "--variants", "plain", "--budget-s", "0", "--out", str(out)])
    rows = _rows(out)
    assert len(rows) == 5 and all(r["skipped"] == "budget" for r in rows)
