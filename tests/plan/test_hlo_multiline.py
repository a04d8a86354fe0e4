"""The HLO reader on XLA:TPU's spellings that once hid work: a Mosaic kernel whose
``kernel_metadata`` spans lines (a continuation line starting with ``}`` used to end the
computation, dropping what followed it in a layer loop's body), and a reduce-scatter written as
an all-reduce whose ``kCustom`` fusion keeps one slice; a loop counter stepping by 2."""

from ditax.plan.audit import audit

_HLO = """
HloModule m

%add (x: bf16[], y: bf16[]) -> bf16[] {
  %x = bf16[] parameter(0)
  %y = bf16[] parameter(1)
  ROOT %s = bf16[] add(%x, %y)
}

%all-reduce-scatter.1 (input: bf16[64,32]) -> bf16[16,32] {
  %input = bf16[64,32]{1,0} parameter(0)
  %ar = bf16[64,32]{1,0} all-reduce(%input), replica_groups={{0,1,2,3}}, to_apply=%add
  %pid = u32[] partition-id()
  %c16 = u32[] constant(16)
  %off = u32[] multiply(%pid, %c16)
  %c0 = u32[] constant(0)
  ROOT %ds = bf16[16,32]{1,0} dynamic-slice(%ar, %off, %c0), dynamic_slice_sizes={16,32}
}

%body (s: (s32[], bf16[64,32])) -> (s32[], bf16[64,32]) {
  %s = (s32[], bf16[64,32]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%s), index=0
  %x = bf16[64,32]{1,0} get-tuple-element(%s), index=1
  %k = bf16[64,32]{1,0} custom-call(%x), custom_call_target="tpu_custom_call", frontend_attributes={kernel_metadata={
"xprof_metadata":"{\\"block_q\\": 512, \\"q_layout\\": 1}"
}}, metadata={op_name="pallas_call"}
  %w = bf16[32,32]{1,0} parameter(1)
  %d = bf16[64,32]{1,0} dot(%k, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %rs = bf16[16,32]{1,0} fusion(%d), kind=kCustom, calls=%all-reduce-scatter.1
  %one = s32[] constant(1)
  %j = s32[] add(%i, %one)
  ROOT %r = (s32[], bf16[64,32]{1,0}) tuple(%j, %d)
}

%cond (s2: (s32[], bf16[64,32])) -> pred[] {
  %s2 = (s32[], bf16[64,32]{1,0}) parameter(0)
  %i2 = s32[] get-tuple-element(%s2), index=0
  %n = s32[] constant(5)
  ROOT %lt = pred[] compare(%i2, %n), direction=LT
}

ENTRY %main (x0: bf16[64,32]) -> bf16[64,32] {
  %x0 = bf16[64,32]{1,0} parameter(0)
  %zero = s32[] constant(0)
  %t0 = (s32[], bf16[64,32]{1,0}) tuple(%zero, %x0)
  %w = (s32[], bf16[64,32]{1,0}) while(%t0), condition=%cond, body=%body
  ROOT %out = bf16[64,32]{1,0} get-tuple-element(%w), index=1
}
"""


def test_multiline_kernel_and_reduce_scatter_inside_a_loop():
    a = audit(_HLO)
    assert a["loops"][0]["trip"] == 5 and a["unknown_trip_counts"] == 0
    assert a["tpu_custom_calls"] == 5
    assert a["xla_flops"] == 5 * 2 * 64 * 32 * 32          # the dot after the kernel
    # the all-reduce + slice is a reduce-scatter of its 64x32 input, per trip
    assert a["collective_bytes"] == {"reduce-scatter": 5 * 64 * 32 * 2}


def test_a_loop_counting_by_two_runs_half_as_often():
    """XLA:TPU's windowed einsum loops (an all-gather matmul as a ring of permutes) count
    their iterations by 2: ``i < 4`` stepping 2 is two trips."""
    text = (_HLO.replace("%n = s32[] constant(5)", "%n = s32[] constant(4)")
            .replace("%one = s32[] constant(1)", "%one = s32[] constant(2)"))
    a = audit(text)
    assert a["loops"][0]["trip"] == 2 and a["tpu_custom_calls"] == 2


def test_a_convolution_over_a_dilated_input_counts_its_real_taps():
    """A dot XLA writes as a convolution with ``lhs_dilate=4`` and a window of 4 (seen in an
    attention's scores): only one tap in 4 meets an input element, so its FLOPs are those of
    a window of 1 — the same as the plain dot."""
    text = """
HloModule m

ENTRY %main (a: bf16[8,16,32], b: bf16[4,32,16]) -> bf16[8,61,16] {
  %a = bf16[8,16,32]{2,1,0} parameter(0)
  %b = bf16[4,32,16]{2,1,0} parameter(1)
  ROOT %c = bf16[8,61,16]{2,1,0} convolution(%a, %b), window={size=4 pad=0_0 lhs_dilate=4}, dim_labels=b0f_0io->b0f
}
"""
    plain = text.replace(" lhs_dilate=4", "")
    assert audit(plain)["xla_flops"] == 2 * 8 * 61 * 16 * 32 * 4
    assert audit(text)["xla_flops"] == 2 * 8 * 61 * 16 * 32
