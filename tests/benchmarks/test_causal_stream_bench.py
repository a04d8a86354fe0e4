"""``benchmarks/causal_stream.py`` at its CPU smoke size: every metric line, the chunk program
compiled once for the whole stream, a cache of the sink + context chunks."""

from __future__ import annotations

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
import causal_stream  # noqa: E402


def test_smoke_size_reports_every_metric(tmp_path, capsys):
    out = tmp_path / "rows.jsonl"
    causal_stream.main(["--size", "tiny", "--height", "32", "--width", "48", "--chunk", "1",
                        "--chunks", "5", "--context-chunks", "2", "--steps", "2",
                        "--attention", "xla", "--dtype", "float32", "--text-tokens", "4",
                        "--out", str(out)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    got = {r["metric"]: r for r in rows}
    assert {"compile_and_first_chunk", "first_chunk", "chunk_median", "frames_per_second",
            "vs_real_time", "kv_cache_bytes", "chunk_programs_compiled"} <= set(got)
    assert got["chunk_programs_compiled"]["value"] == 1
    assert got["chunk_median"]["chunks"] == 5
    # 2 layers, batch 1, 3 slots + the work slot of 6 tokens, 2 heads of 16, float32, k and v
    assert got["kv_cache_bytes"]["shape"] == [2, 1, 24, 2, 16]
    assert got["kv_cache_bytes"]["value"] == 2 * 2 * 24 * 2 * 16 * 4
    assert all(r["value"] > 0 for r in rows)
    assert capsys.readouterr().out.count('"bench": "causal_stream"') == len(rows)
