"""``ditax plan``: targets (chips and topologies), the HLO audit (copies, collectives, loop trip
counts, FLOPs) on known programs, and the command's JSON and its refusals. The TPU compiles
themselves are in test_tpu_compile.py (they need libtpu)."""

import json

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from ditax.cli import main
from ditax.errors import RequestError
from ditax.plan.audit import audit
from ditax.plan.measure import roofline
from ditax.plan.targets import CHIPS, parse_target, tpu_install_hint


def run_cli(capsys, *argv):
    rc = main([str(a) for a in argv])
    cap = capsys.readouterr()
    return rc, cap.out, [ln for ln in cap.err.splitlines() if ln.strip()]


# ---------------------------------------------------------------- targets


def test_targets_name_chips_and_topologies():
    t = parse_target("tpu-v6e-8")
    assert (t.kind, t.topology, t.chip) == ("tpu", "v6e:2x4", CHIPS["v6e"])
    assert parse_target("TPU-v5p-8").topology == "v5p:2x2x1"      # 8 TensorCores = 4 chips
    assert parse_target("cpu:4").num_devices == 4
    for bad, words in (("tpu-v9-8", ["tpu-v6e-8", "cpu:N"]), ("cpu:0", ["N >= 1"])):
        with pytest.raises(RequestError) as e:
            parse_target(bad)
        assert all(w in str(e.value) for w in words)
    assert tpu_install_hint() == f'pip install "jax[tpu]=={jax.__version__}"'


def test_roofline_takes_the_slowest_resource():
    chip = CHIPS["v6e"]
    r = roofline(chip.bf16_flops, chip.hbm_bandwidth / 2, {"all-reduce": chip.ici_bandwidth},
                 chip)
    assert (r["compute_s"], r["hbm_s"], r["ici_s"]) == (1.0, 0.5, 2.0)   # all-reduce: 2x wire
    assert (r["bound"], r["estimate_s"]) == ("ici", 2.0)


# ---------------------------------------------------------------- audit


# A TPU-shaped program: a 3-trip loop whose body relays q out through a copy fusion into an
# all-to-all, copies the result back, runs a Mosaic kernel and a matmul written as a
# convolution whose window runs over a padded length-1 input (one real tap per output).
_HLO = """
HloModule m

%copy_fusion (p0: bf16[8,128]) -> bf16[2,4,128] {
  %p0 = bf16[8,128]{1,0} parameter(0)
  %c = bf16[8,128]{0,1} copy(%p0)
  ROOT %b = bf16[2,4,128]{2,1,0} bitcast(%c)
}

%mixed (p1: f32[16,16]) -> f32[16,16] {
  %p1 = f32[16,16]{1,0} parameter(0)
  %t = f32[16,16]{0,1} copy(%p1)
  ROOT %n = f32[16,16]{1,0} negate(%t)
}

%body (s: (s32[], bf16[8,128])) -> (s32[], bf16[8,128]) {
  %s = (s32[], bf16[8,128]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%s), index=0
  %x = bf16[8,128]{1,0} get-tuple-element(%s), index=1
  %f = bf16[2,4,128]{2,1,0} fusion(%x), kind=kLoop, calls=%copy_fusion
  %a = bf16[2,4,128]{2,1,0} all-to-all(%f), dimensions={0}
  %v = bf16[8,128]{1,0} bitcast(%a)
  %back = bf16[8,128]{0,1} copy(%v)
  %k = bf16[8,128]{1,0} custom-call(%back), custom_call_target="tpu_custom_call"
  %lhs = bf16[1024,64,1]{2,1,0} parameter(1)
  %rhs = bf16[4,16,64]{2,1,0} parameter(2)
  %conv = bf16[1024,4,16]{2,1,0} convolution(%lhs, %rhs), window={size=4 pad=3_3}, dim_labels=bf0_0oi->b0f
  %g = f32[16,16]{1,0} parameter(3)
  %m = f32[16,16]{1,0} fusion(%g), kind=kLoop, calls=%mixed
  %one = s32[] constant(1)
  %j = s32[] add(%i, %one)
  ROOT %r = (s32[], bf16[8,128]{1,0}) tuple(%j, %k)
}

%cond (s2: (s32[], bf16[8,128])) -> pred[] {
  %s2 = (s32[], bf16[8,128]{1,0}) parameter(0)
  %i2 = s32[] get-tuple-element(%s2), index=0
  %n = s32[] constant(3)
  ROOT %lt = pred[] compare(%i2, %n), direction=LT
}

ENTRY %main (x0: bf16[8,128]) -> bf16[8,128] {
  %x0 = bf16[8,128]{1,0} parameter(0)
  %zero = s32[] constant(0)
  %t0 = (s32[], bf16[8,128]{1,0}) tuple(%zero, %x0)
  %w = (s32[], bf16[8,128]{1,0}) while(%t0), condition=%cond, body=%body
  %out = bf16[8,128]{1,0} get-tuple-element(%w), index=1
  %ag = bf16[64,128]{1,0} all-gather(%out), dimensions={0}
  ROOT %last = bf16[8,128]{0,1} copy(%out)
}
"""


def test_audit_counts_copies_collectives_and_kernels_per_trip():
    a = audit(_HLO)
    block = 8 * 128 * 2
    assert a["loops"][0]["trip"] == 3 and a["unknown_trip_counts"] == 0
    # per iteration: the copy fusion and the copy back (both next to the all-to-all)
    one = a["loops"][0]
    assert (one["copy_ops"], one["copy_bytes"]) == (2, 2 * block)
    assert (one["a2a_copy_ops"], one["a2a_copy_bytes"]) == (2, 2 * block)
    assert (one["fused_copy_ops"], one["fused_copy_bytes"]) == (1, 16 * 16 * 4)
    # per call: three iterations and the copy after the loop
    assert (a["copy_ops"], a["copy_bytes"]) == (7, 7 * block)
    assert a["tpu_custom_calls"] == 3 and a["all_to_all_ops"] == 3
    assert a["collective_bytes"] == {"all-to-all": 3 * block, "all-gather": 8 * block}
    # the convolution: 1024x4x16 outputs x 64 inputs x 1 real tap (not 4), 2 FLOPs each
    assert a["xla_flops"] == 3 * 2 * 1024 * 4 * 16 * 64


def test_audit_of_a_cpu_compiled_loop():
    """Trip counts from XLA's own loop analysis and, without it, from the condition (here a
    compare wrapped in a fusion); collectives inside the loop count once per iteration."""
    mesh = jax.make_mesh((8,), ("c",))

    def f(x):
        def body(i, x):
            y = jax.lax.all_to_all(x, "c", 1, 0, tiled=True)
            return jnp.swapaxes(y, 0, 1) * 2
        return jax.lax.fori_loop(0, 5, body, x)

    g = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("c"), out_specs=P("c")))
    arg = jax.ShapeDtypeStruct((64, 64), jnp.float32, sharding=NamedSharding(mesh, P("c")))
    text = g.lower(arg).compile().as_text()
    for t in (text, text.replace(',"known_trip_count":{"n":"5"}', "")):
        a = audit(t)
        assert [lp["trip"] for lp in a["loops"]] == [5]
        assert a["all_to_all_ops"] == 5
        assert a["collective_bytes"]["all-to-all"] == 5 * 8 * 64 * 4


# ---------------------------------------------------------------- the command


def test_plan_refuses_unknown_targets_and_missing_libtpu(capsys, monkeypatch):
    rc, _, err = run_cli(capsys, "plan", "tiny", "--target", "tpu-v9-8")
    assert rc == 2 and len(err) == 1 and "unknown --target 'tpu-v9-8'" in err[0]
    from ditax.plan import targets

    monkeypatch.setattr(targets, "has_libtpu", lambda: False)
    rc, _, err = run_cli(capsys, "plan", "tiny", "--target", "tpu-v6e-8", "--compile")
    assert rc == 2 and len(err) == 1, err
    assert "needs libtpu" in err[0] and f'pip install "jax[tpu]=={jax.__version__}"' in err[0]


def test_plan_json_reports_forward_and_train_step(capsys, tmp_path):
    hlo = tmp_path / "fwd.hlo"
    rc, out, err = run_cli(capsys, "plan", "tiny", "--target", "cpu:4", "mesh.fsdp=-1",
                           "--compile", "--train", "--json", "--dump-hlo", hlo)
    assert rc == 0, err
    res = json.loads(out)
    assert res["target"] == "cpu:4" and res["platform"] == "cpu"
    for key in ("forward", "train_step"):
        p = res[key]
        for field in ("temp_bytes", "argument_bytes", "output_bytes", "copy_bytes", "copy_ops",
                      "flops", "collective_bytes"):
            assert field in p, (key, field)
        assert p["flops"] > 0 and p["argument_bytes"] > 0
        assert p["per_layer"] is not None           # the layer scan: one loop of num_layers
    # the train step holds the optimiser state too: more arguments than the forward
    assert res["train_step"]["argument_bytes"] > res["forward"]["argument_bytes"]
    assert audit(hlo.read_text())["copy_ops"] == res["forward"]["copy_ops"]


def test_train_plan_of_a_bucketed_dataset_sizes_its_largest_bucket(capsys, tmp_path):
    """A dataset written with buckets (meta.json version 2): the train step is planned at its
    largest bucket (the memory peak), named with the others in the report."""
    from bucket_datasets import write_bucketed

    ds, _ = write_bucketed(tmp_path / "ds", {"64x64x5": 2, "64x128x5": 2})
    rc, out, err = run_cli(capsys, "plan", "tiny", "--target", "cpu:4", "mesh.fsdp=-1",
                           "--train", "--json", f"data.source={ds}", "batch_size=4")
    assert rc == 0, err
    step = json.loads(out)["train_step"]
    assert step["latents"] == [4, 16, 2, 16, 8]
    assert step["bucket"] == "64x128x5" and step["buckets"] == ["64x64x5", "64x128x5"]
