"""benchmarks/tpu_process.py: an empty JAX process's wall split into phases (CPU children)."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import tpu_process  # noqa: E402


def test_rows_split_each_exits_wall_into_phases_that_add_up(tmp_path):
    out = tmp_path / "rows.jsonl"
    rows = tpu_process.main(["--platform", "cpu", "--repeats", "1", "--out", str(out)])
    assert [r["case"] for r in rows] == ["empty JAX process, exit=normal",
                                         "empty JAX process, exit=os_exit"]
    for r in rows:
        assert r["backend"] == "cpu" and r["times"] == [r["value"]]
        p = r["phases"]
        assert set(p) == {"interpreter", "import", "devices", "first_op", "exit"}
        assert min(p[k] for k in ("interpreter", "import", "devices", "first_op")) >= 0
        assert abs(sum(p.values()) - r["value"]) <= 0.005       # rounding of five parts
    assert [json.loads(x) for x in out.read_text().splitlines()] == rows


def test_an_unknown_exit_is_refused_before_any_child(capsys):
    with pytest.raises(SystemExit) as e:
        tpu_process.main(["--exits", "normal,abort"])
    assert e.value.code == 2 and "'normal,abort'" in capsys.readouterr().err
