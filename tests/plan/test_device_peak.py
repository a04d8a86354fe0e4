"""The plan's chip-comparable memory (issue 55 item 2): buffers (arguments + outputs - aliased +
generated code: what a TPU's ``memory_stats()["peak_bytes_in_use"]`` reads), temporaries
(``peak_bytes_reserved``) and their sum, judged against the chip's ``bytes_limit``; where a
program does not fit, the change that makes it; and the plan's stored numbers for the chip's
rows (``docs/plan_vs_chip.jsonl``) against the chip's (``docs/tpu_v5e.jsonl``)."""

import json
import pathlib
import sys
import types

import pytest

from ditax.cli.plan import device_peak_line
from ditax.config import load_config
from ditax.plan.fit import suggestion
from ditax.plan.fit_phases import with_model
from ditax.plan.measure import against, device_peak, memory
from ditax.plan.targets import CHIPS

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

MIB = 2 ** 20
#: ``benchmarks/tpu_chip.py --part memprobe`` on a v5e (JAX 0.10.2): ``(x @ x) @ x`` of a bf16
#: [16384, 16384] x; the compiler's memory_analysis and the device's stats around one call
PROBE = dict(argument_size_in_bytes=512 * MIB, output_size_in_bytes=512 * MIB,
             temp_size_in_bytes=512 * MIB, alias_size_in_bytes=0,
             host_argument_size_in_bytes=0, generated_code_size_in_bytes=4_993_024,
             peak_memory_in_bytes=0)
IN_USE_BEFORE, X_BYTES = 536_974_848, 512 * MIB        # x + a few small buffers
PEAK_IN_USE_AFTER, PEAK_RESERVED_AFTER = 1_078_838_784, 536_870_912


def fake_compiled(**fields):
    return types.SimpleNamespace(memory_analysis=lambda: types.SimpleNamespace(**fields))


def test_device_peak_is_the_probes_in_use_and_reserved_bytes():
    m = memory(fake_compiled(**PROBE))
    assert m["device_buffer_bytes"] == 1024 * MIB + 4_993_024
    # the chip's peak in use: these buffers plus what was live before besides x
    assert m["device_buffer_bytes"] + (IN_USE_BEFORE - X_BYTES) == PEAK_IN_USE_AFTER
    assert m["device_temp_bytes"] == PEAK_RESERVED_AFTER
    assert m["device_peak_bytes"] == m["device_buffer_bytes"] + m["device_temp_bytes"]


def test_aliased_outputs_and_host_arguments_are_not_device_buffers():
    m = device_peak(dict(argument_bytes=100, output_bytes=40, alias_bytes=30, temp_bytes=7,
                         code_bytes=5, host_argument_bytes=1000))
    assert m == {"device_buffer_bytes": 115, "device_temp_bytes": 7, "device_peak_bytes": 122}


def test_fits_is_judged_on_buffers_plus_temporaries_against_the_chips_limit():
    v5e = CHIPS["v5e"]
    assert v5e.limit_bytes == 16_909_336_064            # memory_stats()["bytes_limit"]
    assert CHIPS["v6e"].limit_bytes == CHIPS["v6e"].hbm_bytes   # not measured: published
    at = {"device_peak_bytes": v5e.limit_bytes}
    assert against(at, v5e)["fits"] is True
    assert against({"device_peak_bytes": v5e.limit_bytes + 1}, v5e)["fits"] is False
    # XLA's heap peak under the limit does not make it fit: the temporaries are reserved whole
    m = memory(fake_compiled(**{**PROBE, "temp_size_in_bytes": 15 * 2 ** 30,
                                "peak_memory_in_bytes": 15 * 2 ** 30}))
    assert m["peak_bytes"] < v5e.limit_bytes < m["device_peak_bytes"]
    assert against(m, v5e)["fits"] is False
    assert against(m, v5e)["hbm_capacity_bytes"] == 16_909_336_064


def test_a_program_that_does_not_fit_names_the_next_change_of_the_fit_ladder():
    cfg = load_config("tiny", [])
    v5e = CHIPS["v5e"]
    assert suggestion(cfg, v5e, 1e9).startswith("model.offload=host")
    off = with_model(cfg, offload="host")
    assert suggestion(off, v5e, 1e9).startswith("model.quantize=int8")
    both = with_model(cfg, offload="host", quantize="int8")      # nothing of the ladder left
    assert suggestion(both, v5e, 40e9).startswith("more chips: tpu-v5e-4")
    line = device_peak_line({"fits": False, "suggestion": "model.offload=host (x)",
                             "device_buffer_bytes": 2 ** 30, "device_temp_bytes": 2 ** 34,
                             "device_peak_bytes": 2 ** 30 + 2 ** 34,
                             "hbm_capacity_bytes": v5e.limit_bytes})
    assert "17.00 GiB of 15.75 GiB: does NOT fit; to fit: model.offload=host" in line
    assert "peak_bytes_in_use" in line and "peak_bytes_reserved" in line


def test_case_peak_keeps_both_parts_and_only_a_cases_own_sum():
    from tpu_sweep import case_peak

    before = {"peak_bytes_in_use": 10, "peak_bytes_reserved": 5}
    own = case_peak(before, {"peak_bytes_in_use": 20, "peak_bytes_reserved": 8})
    assert (own["peak_bytes_in_use"], own["peak_bytes_reserved"], own["peak_hbm_bytes"]) == (
        20, 8, 28) and "peak_hbm_how" in own
    # the reserved part not raised: an earlier case's may be in it; only a bound
    part = case_peak(before, {"peak_bytes_in_use": 20, "peak_bytes_reserved": 5})
    assert part["peak_hbm_bytes"] is None and part["peak_hbm_at_most"] == 25
    assert part["peak_bytes_reserved"] is None and part["peak_bytes_in_use"] == 20
    # a runtime without reserved bytes: the in-use peak alone
    assert case_peak({"peak_bytes_in_use": 1}, {"peak_bytes_in_use": 3})["peak_hbm_bytes"] == 3
    assert case_peak({}, {}) == {"peak_hbm_bytes": None}


STORED = ROOT / "docs" / "plan_vs_chip.jsonl"


def stored_rows() -> list[dict]:
    return [json.loads(x) for x in STORED.read_text().splitlines() if x.strip()]


def test_the_stored_plan_matches_every_chip_row_it_can():
    """Every model row of the chip's table with a peak has a plan line; where the chip's peak
    is the case's own (``peak_bytes_in_use``: a count of buffers) the plan's buffers are
    within 10 % of it, where it is only bounded they are under the bound; every row ran on
    the chip, and the plan says it fits."""
    from plan_vs_chip import chip_rows, WITHIN

    rows = stored_rows()
    chip = chip_rows(str(ROOT / "docs" / "tpu_v5e.jsonl"))
    assert {(r["case"], r.get("session")) for r in chip} <= {(r["case"], r["session"])
                                                              for r in rows}
    for r in rows:
        assert r["plan_fits"] is True and r["fits_agrees"], r["case"]
        if r.get("chip_peak_bytes_in_use"):
            assert abs(r["plan_buffer_bytes"] / r["chip_peak_bytes_in_use"] - 1) <= WITHIN, r
            assert r["within_10pct"] and r["value"] == round(
                r["plan_buffer_bytes"] / r["chip_peak_bytes_in_use"], 4)
        else:
            assert r["plan_buffer_bytes"] <= r["chip_peak_at_most"], r
        assert r["plan_device_peak_bytes"] == r["plan_buffer_bytes"] + r["plan_temp_bytes"]
        if r.get("chip_peak_bytes_reserved") is None:
            assert r["chip_reserved"].startswith("not recorded")
        else:
            assert r["plan_temps_over_chip_reserved"] == round(
                r["plan_temp_bytes"] / r["chip_peak_bytes_reserved"], 4)
            if r.get("chip_peak_bytes_in_use"):   # both parts: the plan's peak against the sum
                chip_sum = r["chip_peak_bytes_in_use"] + r["chip_peak_bytes_reserved"]
                assert abs(r["plan_device_peak_bytes"] / chip_sum - 1) <= WITHIN, r
            else:   # buffers only bounded: the temporaries against the case's own reserved
                assert abs(r["plan_temps_over_chip_reserved"] - 1) <= WITHIN, r
                assert r["plan_device_peak_bytes"] <= (r["chip_peak_at_most"]
                                                       + r["chip_peak_bytes_reserved"]), r


if __name__ == "__main__":   # pragma: no cover
    pytest.main([__file__])
