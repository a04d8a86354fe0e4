"""``benchmarks/tpu_loader.py`` (big models through the real loader on one chip): the tiny case
runs its whole path on CPU — the folder written by the random-folder writer, each variant
loaded by ``ditax.load_transformer`` in a process of its own and timed by ``ditax bench``'s
forward — and its rows say what a chip's would: offloaded weights on the host (forward equal
to the resident model's), 8-bit weights smaller on the device (forward close to it), and the
bf16 resident load flagged as the full copy it is. A host too small is refused in one line
before anything is written."""

from __future__ import annotations

import json
import os
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import tpu_loader  # noqa: E402


def rows_of(path) -> dict:
    rows = [json.loads(x) for x in open(path) if x.strip()]
    return {(r["case"].rsplit(" loaded ", 1)[-1], r["metric"]): r for r in rows}


def test_tiny_case_runs_every_variant_through_the_loader(tmp_path):
    out = tmp_path / "rows.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]), "JAX_PLATFORMS": "cpu"}
    assert tpu_loader.main(["--case", "tiny", "--dir", str(tmp_path / "w"), "--check",
                            "--out", str(out)], env=env) == 0
    rows = rows_of(out)
    assert not [r for r in rows.values() if "error" in r or "skipped" in r], rows
    write = rows[("Wan tiny 32x32x5 write", "write")]
    assert write["bytes"] == write["params"] * 2 and write["value"] > 0   # bf16, as written
    assert not (tmp_path / "w" / "tiny").exists()       # removed after its variants (no --keep)

    bf16, off = rows[("bf16", "load")], rows[("offload=host", "load")]
    weights = bf16["weight_bytes"]
    assert bf16["full_copy_on_device"] and bf16["device_param_bytes"] == weights
    assert bf16["host_param_bytes"] == 0 and bf16["ok"]
    for tag in ("offload=host", "int8", "int8 offload=host"):
        load = rows[(tag, "load")]
        assert load["ok"] and not load["full_copy_on_device"], load
        assert load["device_load_bytes"] < weights and load["value"] > 0
        fwd = rows[(tag, "forward")]
        assert fwd["value"] > 0 and fwd["finite"] and fwd["latent"] == [1, 16, 2, 4, 4]
    # offloaded: the block kernels on the host, the rest on the device, the same numbers
    assert off["host_param_bytes"] + off["device_param_bytes"] == weights
    assert off["host_param_bytes"] > weights / 2 and off["within_a_block"]
    assert rows[("offload=host", "forward")]["rel_err_vs_bf16_resident"] == 0.0
    # 8-bit: the block kernels in one byte a weight, a forward near the bf16 one (not equal)
    int8, both = rows[("int8", "load")], rows[("int8 offload=host", "load")]
    assert int8["device_param_bytes"] < weights - off["host_param_bytes"] / 4
    assert off["host_param_bytes"] / 2 <= both["host_param_bytes"] < off["host_param_bytes"] * 0.6
    err = rows[("int8", "forward")]["rel_err_vs_bf16_resident"]
    assert 0 < err < 0.05
    assert rows[("int8 offload=host", "forward")]["rel_err_vs_bf16_resident"] == err
    assert rows[("bf16", "forward")]["rel_err_vs_bf16_resident"] == 0.0


def test_a_short_host_is_refused_before_writing(tmp_path, monkeypatch, capsys):
    line = tpu_loader.room(str(tmp_path / "x"), 10**16, 0)
    assert line.startswith("needs 10000001.1 GB free under") and "--dir" in line
    monkeypatch.setattr(tpu_loader, "mem_available", lambda: 8 * 2**30)
    line = tpu_loader.room(str(tmp_path / "x"), 10**9, 20 * 10**9)
    assert "of host memory" in line and "has 8.6 GB available" in line
    assert tpu_loader.room(str(tmp_path / "x"), 10**9, 10**9) is None
    if tpu_loader.fs_type("/dev/shm") == "tmpfs":       # the file itself counts there
        assert tpu_loader.room("/dev/shm/x", 5 * 10**9, 10**9) is not None
    out = tmp_path / "rows.jsonl"
    assert tpu_loader.main(["--case", "wan14b", "--dir", str(tmp_path / "w"),
                            "--out", str(out)]) == 0
    (row,) = [json.loads(x) for x in open(out)]
    assert row["metric"] == "write" and row["skipped"].startswith("wan14b needs "), row
    assert not (tmp_path / "w").exists()
    assert "tpu_loader: wan14b needs" in capsys.readouterr().err


def test_block_sizes_and_variants():
    from ditax.recipes.random_folders import plan

    part = plan("tiny", dtype="bfloat16")[1].parts[0]
    sizes = tpu_loader.block_sizes(part)
    assert sizes["blocks"] == 2 * sizes["block"] and 0 < sizes["blocks"] < part.nbytes
    ffn = dict(part.tensors)["blocks.0.ffn.net.0.proj.weight"]     # the largest of a block
    assert sizes["stack"] == 2 * 2 * ffn[0] * ffn[1]               # two blocks, bf16
    off = (tpu_loader.OFFLOAD,)
    assert tpu_loader.host_need(sizes, off) == sizes["blocks"] + sizes["stack"]
    assert tpu_loader.host_need(sizes, off + (tpu_loader.INT8,)) == (
        sizes["blocks"] // 2 + sizes["stack"])
    with pytest.raises(SystemExit):
        tpu_loader.main(["--case", "tiny", "--variants", "int4"])
