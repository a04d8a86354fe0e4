"""``benchmarks/quant_fusions.py`` (a block's W+A fusions on a v5e, deviceless): its reading
of an optimized HLO text — each top-level instruction's kind, HBM bytes (a VMEM ``S(1)``
array not counted), s8 x s8 operations, roofline time and libtpu's estimated cycles — on a
hand-written program whose numbers are known."""

from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
import quant_fusions  # noqa: E402

HLO = """HloModule m

%fused_computation (param_0: s8[4096,4096], param_1: s8[4096,2048]) -> s32[4096,2048] {
  %param_0 = s8[4096,4096]{1,0} parameter(0)
  %param_1 = s8[4096,2048]{1,0} parameter(1)
  ROOT %convolution.1 = s32[4096,2048]{1,0} convolution(%param_0, %param_1), dim_labels=bf_io->bf
}

%fused_computation.1 (param_0.1: bf16[4096,4096]) -> s8[4096,4096] {
  %param_0.1 = bf16[4096,4096]{1,0} parameter(0)
  %round.1 = bf16[4096,4096]{1,0} round-nearest-even(%param_0.1)
  ROOT %convert.1 = s8[4096,4096]{1,0} convert(%round.1)
}

ENTRY %main (x: bf16[4096,4096], w: s8[4096,2048]) -> s32[4096,2048] {
  %x = bf16[4096,4096]{1,0} parameter(0)
  %w = s8[4096,2048]{1,0} parameter(1)
  %cs = (s8[4096,2048]{1,0:T(8,128)S(1)}, s8[4096,2048]{1,0}, u32[]) copy-start(%w)
  %cd = s8[4096,2048]{1,0:T(8,128)S(1)} copy-done(%cs)
  %q = s8[4096,4096]{1,0:T(8,128)} fusion(%x), kind=kLoop, calls=%fused_computation.1, backend_config={"estimated_cycles":"150000"}
  ROOT %d = s32[4096,2048]{1,0} fusion(%q, %cd), kind=kOutput, calls=%fused_computation, backend_config={"estimated_cycles":"300000"}
}
"""


def test_fusions_kinds_bytes_and_times():
    rows = {r["name"]: r for r in quant_fusions.fusions(HLO)}
    assert {n: r["kind"] for n, r in rows.items()} == {"cs": "async", "cd": "async",
                                                       "q": "quant", "d": "dot"}
    q, d = rows["q"], rows["d"]
    assert q["mb"] == pytest.approx((2 + 1) * 4096 * 4096 / 1e6, abs=0.01)
    assert q["ms"] == pytest.approx(1e3 * 3 * 4096 * 4096 / 819e9, rel=1e-3)
    assert q["xla_ms"] == pytest.approx(0.1)
    # the kernel is read from VMEM (S(1)): not counted
    assert d["mb"] == pytest.approx((4096 * 4096 + 4 * 4096 * 2048) / 1e6, abs=0.01)
    assert d["gops_s8"] == pytest.approx(2 * 4096 * 4096 * 2048 / 1e9, abs=0.01)
    assert d["gflops"] == 0
    assert d["ms"] == pytest.approx(1e3 * 2 * 4096 ** 2 * 2048 / 394e12, rel=1e-3)
    s = quant_fusions.summary(list(rows.values()))
    assert s["ms"] == pytest.approx(q["ms"] + d["ms"], abs=2e-3)
    assert s["xla_ms"] == pytest.approx(0.3)
    assert s["by_kind"]["async"]["n"] == 2


LOOP = """HloModule m

%fused_computation (param_0: s8[4096,4096], param_1: s8[4096,4096]) -> s32[4096,4096] {
  %param_0 = s8[4096,4096]{1,0} parameter(0)
  %param_1 = s8[4096,4096]{1,0} parameter(1)
  ROOT %convolution.1 = s32[4096,4096]{1,0} convolution(%param_0, %param_1), dim_labels=bf_io->bf
}

%body (s: (s32[], s8[4096,4096])) -> (s32[], s8[4096,4096]) {
  %s = (s32[], s8[4096,4096]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%s), index=0
  %x = s8[4096,4096]{1,0} get-tuple-element(%s), index=1
  %d = s32[4096,4096]{1,0} fusion(%x, %x), kind=kOutput, calls=%fused_computation, backend_config={"estimated_cycles":"1500000"}
  %one = s32[] constant(1)
  %j = s32[] add(%i, %one)
  ROOT %r = (s32[], s8[4096,4096]{1,0}) tuple(%j, %x)
}

%cond (s2: (s32[], s8[4096,4096])) -> pred[] {
  %s2 = (s32[], s8[4096,4096]{1,0}) parameter(0)
  %i2 = s32[] get-tuple-element(%s2), index=0
  %n = s32[] constant(5)
  ROOT %lt = pred[] compare(%i2, %n), direction=LT
}

ENTRY %main (x0: s8[4096,4096]) -> s8[4096,4096] {
  %x0 = s8[4096,4096]{1,0} parameter(0)
  %zero = s32[] constant(0)
  %t0 = (s32[], s8[4096,4096]{1,0}) tuple(%zero, %x0)
  %w = (s32[], s8[4096,4096]{1,0}) while(%t0), condition=%cond, body=%body
  ROOT %out = s8[4096,4096]{1,0} get-tuple-element(%w), index=1
}
"""


def test_a_loop_body_counts_its_trip_count():
    """The layer loop's product runs 5 times a call: its row says so and the sums weigh it."""
    rows = quant_fusions.fusions(LOOP)
    d = next(r for r in rows if r["name"] == "d")
    assert d["times"] == 5 and d["kind"] == "dot" and d["xla_ms"] == pytest.approx(1.0)
    s = quant_fusions.summary(rows)
    assert s["xla_ms"] == pytest.approx(5.0) and s["xla_ms_per_run"]["5"] == pytest.approx(1.0)
    assert s["by_kind"]["dot"]["n"] == 5
