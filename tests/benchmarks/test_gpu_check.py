"""``benchmarks/gpu_check.py --dry``: the one-shot GPU script runs end to end on CPU (tiny
shapes, jax's xla implementation standing in for cuDNN), so the script a lent GPU runs once
is known to work before it gets there."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

from xla_test_flags import xla_flags

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_gpu_check_dry_run_prints_every_check():
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT / "src"))
    env["XLA_FLAGS"] = xla_flags(1)
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--dry",
                           "--budget", "600"],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert rows and all(r["bench"] == "gpu_check" and "metric" in r for r in rows)
    errors = [r for r in rows if r["metric"] in ("error", "skipped") or r.get("ok") is False]
    assert not errors, errors
    cases = {r["case"] for r in rows}
    assert {"versions", "matmul_bf16", "cudnn_vs_reference", "cudnn_tflops", "wan2", "te",
            "torch", "wan_full", "train_step", "summary"} <= cases
    shapes = {r.get("shape") for r in rows if r["case"] == "cudnn_vs_reference"}
    assert {"self_L31_K64_padded", "cross_L33_T13_K64"} <= shapes
    assert {r["metric"] for r in rows if r["case"] == "wan2"} == {"out_rel_err",
                                                                 "grad_rel_err"}
    assert rows[-1]["case"] == "summary" and rows[-1]["value"] == 0
