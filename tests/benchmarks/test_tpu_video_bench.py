"""``benchmarks/tpu_video.py`` (issue 54, item 5: a 480p video in seconds) on CPU with the demo
folder as its Wan case at a tiny size: ``--override KEY=VALUE`` reaches its ``ditax generate``
(a bfloat16 VAE here; a bad value is that row's error) and is kept in its rows, whose phases
read the write's overlapped seconds."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEMO = ROOT / "src" / "ditax" / "assets" / "demo_model"


def _bench(tmp_path, *flags) -> list[dict]:
    out = tmp_path / f"rows{len(list(tmp_path.iterdir()))}.jsonl"    # the script appends
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "tpu_video.py"), "--out", str(out),
                    "--folder", str(DEMO), "--size", "16x32x5", "--steps", "1", "--skip", "demo",
                    *flags], check=True, env=env, capture_output=True, timeout=600)
    return [json.loads(x) for x in open(out) if x.strip()]


@pytest.mark.slow   # 10 s: a whole ditax generate of the demo folder
def test_overrides_reach_generate_and_its_rows(tmp_path):
    rows = _bench(tmp_path, "--override", "model.vae_dtype=bfloat16", "--override",
                  "sample.cfg_mode=sequential")
    assert [r["mode"] for r in rows] == ["cold", "warm"]
    for r in rows:
        assert "error" not in r, r
        assert r["overrides"] == ["model.vae_dtype=bfloat16", "sample.cfg_mode=sequential"]
        assert {"decode", "write", "overlapped"} <= set(r["phases"]), r["phases"]
    bad = _bench(tmp_path, "--override", "model.vae_dtype=int8")
    assert len(bad) == 2 and all("model.vae_dtype='int8' is not one of" in r["error"]
                                 for r in bad), bad
