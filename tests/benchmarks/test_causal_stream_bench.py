"""``benchmarks/causal_stream.py`` at its CPU smoke size: every metric line, the chunk program
compiled once for the whole stream, a cache of the sink + context chunks; several cases in
one call under ``--budget-s``; the FLOPs a chunk it reports."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
import causal_stream  # noqa: E402


def test_smoke_size_reports_every_metric_and_keeps_to_the_budget(tmp_path, capsys):
    out = tmp_path / "rows.jsonl"
    causal_stream.main(["--size", "tiny", "--height", "32", "--width", "48", "--chunk", "1",
                        "--chunks", "5", "--cases", "ctx2_steps2,ctx1_steps3_int8wa",
                        "--budget-s", "0.001", "--attention", "xla", "--dtype", "float32",
                        "--text-tokens", "4", "--out", str(out)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    got = {r["metric"]: r for r in rows if "ctx2_steps2" in r["case"]}
    assert {"compile_and_first_chunk", "first_chunk", "chunk_median", "frames_per_second",
            "vs_real_time", "flops_per_chunk", "model_tflops_per_s", "kv_cache_bytes",
            "chunk_programs_compiled"} <= set(got)
    assert got["chunk_programs_compiled"]["value"] == 1
    assert got["chunk_median"]["chunks"] == 5
    # 2 layers, batch 1, 3 slots + the work slot of 6 tokens, 2 heads of 16, float32, k and v
    assert got["kv_cache_bytes"]["shape"] == [2, 1, 24, 2, 16]
    assert got["kv_cache_bytes"]["value"] == 2 * 2 * 24 * 2 * 16 * 4
    assert all(r["value"] > 0 for r in got.values())
    # the second case does not fit the budget: one line says so, nothing is built for it
    (skip,) = [r for r in rows if r["case"].endswith("ctx1_steps3_float32_int8wa")]
    assert skip["metric"] == "skipped" and "--budget-s" in skip["reason"]
    assert capsys.readouterr().out.count('"bench": "causal_stream"') == len(rows)


def test_cases_and_flops():
    assert causal_stream.parse_case("ctx1_steps3_int8wa") == dict(
        context_chunks=1, steps=3, quantize="int8", activations=True)
    assert causal_stream.parse_case("ctx3_steps4")["quantize"] == "none"
    with pytest.raises(SystemExit, match="ctx<C>_steps<S>"):
        causal_stream.parse_case("ctx1-steps3")
    from ditax.config import ModelConfig

    # Wan 1.3B 480x832, chunks of 4,680 tokens, sink + 3 chunks + itself, 4 steps + the
    # write: docs/causal_streaming.md's 1.62e14 (linears 5.85e13, self-attention 1.01e14)
    f = causal_stream.chunk_flops(ModelConfig(), 4680, 5 * 4680, 4, 512)
    assert f["total"] == pytest.approx(1.624e14, rel=1e-3)
    assert f["linear"] == pytest.approx(5.85e13, rel=1e-3)
    assert f["self_attention"] == pytest.approx(1.009e14, rel=1e-3)
    assert causal_stream.chunk_flops(ModelConfig(), 4680, 3 * 4680, 3, 512)["total"] == (
        pytest.approx(9.76e13, rel=1e-3))
