"""``benchmarks/tpu_train.py`` (training steps on a chip): its LoRA case runs on CPU at the
tiny preset's shapes, a row with a finite loss, positive model FLOPs and a time per step; its
dataset holds the shapes it was asked for and the empty prompt's embedding."""

from __future__ import annotations

import json
import math
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
import tpu_train  # noqa: E402


def test_the_lora_case_runs_at_the_tiny_shape(tmp_path):
    assert tpu_train.main(["--small", "--case", "lora", "--repeats", "1", "--work",
                           str(tmp_path), "--out", str(tmp_path / "rows.jsonl")]) == 0
    (row,) = [json.loads(x) for x in open(tmp_path / "rows.jsonl")]
    assert "error" not in row, row
    assert math.isfinite(row["loss"]) and row["flops"] > 0 and row["value"] > 0
    assert row["settings"] == ["lora.rank=32"] and len(row["times"]) == 1
    meta = json.loads((tmp_path / "data_lora" / "meta.json").read_text())
    assert tuple(meta["latent_shape"]) == (16, 2, 8, 8), meta
