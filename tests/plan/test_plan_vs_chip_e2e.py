"""The plan's numbers for the chip's rows, compiled again (end-to-end tier: deviceless TPU
compiles of full-size models, a minute or more each): ``ditax plan --target tpu-v5e-1
--compile`` of the chip's cheapest row gives the numbers stored in ``docs/plan_vs_chip.jsonl``
(within 2 %: a libtpu upgrade may move them a little; more, and the stored lines must be
rewritten with ``benchmarks/plan_vs_chip.py``) and its buffers are within 10 % of the chip's
``peak_bytes_in_use``."""

import importlib.util
import json
import pathlib
import sys

import jax
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

needs_libtpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None,
    reason=f'libtpu is not installed: pip install "jax[tpu]=={jax.__version__}"')

#: the cheapest row (about 75 s to compile here; FLUX.2-klein's takes 3 to 6 minutes, the
#: 480x832x81 ones 2 to 3: their stored numbers are checked in test_device_peak.py)
CASES = [("Wan 2.1 1.3B 480x832x17 forward bf16", 55)]


@needs_libtpu
@pytest.mark.parametrize("case,session", CASES)
def test_the_plan_of_a_chip_row_is_the_stored_one_and_within_10pct(case, session):
    from plan_vs_chip import WITHIN, chip_rows, compare, latent_of, plan_json

    row = next(r for r in chip_rows(str(ROOT / "docs" / "tpu_v5e.jsonl"))
               if r["case"] == case and r.get("session") == session)
    fwd = plan_json(row["config"], list(row["overrides"]) + ["compile_cache=none"],
                    latent_of(row))["forward"]
    now = compare(row, fwd)
    stored = next(json.loads(x) for x in (ROOT / "docs" / "plan_vs_chip.jsonl").open()
                  if json.loads(x)["case"] == case and json.loads(x)["session"] == session)
    for k in ("plan_buffer_bytes", "plan_temp_bytes", "plan_device_peak_bytes"):
        assert abs(now[k] / stored[k] - 1) <= 0.02, (k, now[k], stored[k])
    assert now["plan_fits"] is True
    assert abs(now["plan_buffer_bytes"] / now["chip_peak_bytes_in_use"] - 1) <= WITHIN
