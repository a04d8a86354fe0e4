"""``benchmarks/causal_steps_quality.py``: the student's own sigmas strided to fewer steps, a
setting that does not divide them refused in one line before any work, and (slow) one setting
scored end to end on the shipped demo causal student."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
import causal_steps_quality as csq  # noqa: E402


def test_fewer_steps_take_the_students_own_levels():
    assert csq.subset_sigmas([1.0, 0.75, 0.5, 0.25], 2) == [1.0, 0.5]
    assert csq.subset_sigmas([1.0, 0.75, 0.5, 0.25], 1) == [1.0]
    assert csq.subset_sigmas([1.0, 0.75, 0.5, 0.25], 4) == [1.0, 0.75, 0.5, 0.25]
    with pytest.raises(SystemExit, match="3 steps do not divide the student's 4 sigmas"):
        csq.subset_sigmas([1.0, 0.75, 0.5, 0.25], 3)
    assert csq.parse_setting("2:1") == (2, 1)
    with pytest.raises(SystemExit, match="'2-1' is not STEPS:CONTEXT"):
        csq.parse_setting("2-1")


def test_a_bad_setting_is_refused_before_loading_anything(capsys):
    with pytest.raises(SystemExit, match="3 steps do not divide"):
        csq.main(["--settings", "4:3", "3:1", "--prompts", "1"])
    assert capsys.readouterr().out == ""


@pytest.mark.slow
def test_one_setting_scores_the_shipped_student_per_window(tmp_path):
    import ditax.demo

    if not (ditax.demo.causal_model_path() / "ditax_sample.json").exists():
        pytest.skip("no shipped demo causal student")
    out = tmp_path / "q.jsonl"
    csq.main(["--settings", "2:1", "--prompts", "1", "--long", "2", "--out", str(out)])
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    from ditax.demo.causal import long_frames, windows

    n = long_frames(17, 4, 2)       # 37: 2 x the teacher's 5 latent frames
    assert [(r["frames"], r["metric"]) for r in rows] == [
        (17, "colour"), (17, "direction"), (n, "colour"), (n, "direction")]
    assert rows[0]["sigmas"] == [1.0, 0.5] and rows[0]["context_chunks"] == 1
    assert rows[2]["windows"] == len(windows(n, 17)) == 3
    assert all(0 <= r["value"] <= 100 for r in rows)
