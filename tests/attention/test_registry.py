"""The attention registry (declared capabilities and their refusal messages), options, the
target platform switch, attention plans and ``check_available`` — all decided before anything
is traced, so these run on CPU for every platform."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import ditax
from ditax.attention import (
    BACKENDS,
    AttentionConfig,
    AttentionPlan,
    AttentionUnavailable,
    attend,
    check_available,
    plan_attention,
)
from ditax.attention.config import LOCAL_BACKENDS, PARALLEL_BACKENDS
from ditax.attention.options import FlashOptions, SequenceOptions, UlyssesRingOptions
from ditax.parallel.mesh import make_mesh
from ditax.parallel.platform import Platform, platform_of

CPU = Platform("cpu")
H100 = Platform("cuda", (9, 0))
A100 = Platform("cuda", (8, 0))


# ---------------------------------------------------------------- registry


def test_registry_names_are_the_config_names():
    assert tuple(BACKENDS) == LOCAL_BACKENDS + PARALLEL_BACKENDS
    assert {n for n, b in BACKENDS.items() if b.kind == "sequence"} == set(PARALLEL_BACKENDS)
    assert BACKENDS["ulysses_ring"].options is UlyssesRingOptions
    assert [n for n, b in BACKENDS.items() if b.carries] == ["flash"]
    assert BACKENDS["xla"].lse == "beside" and BACKENDS["cudnn"].lse == "none"
    assert {n: b.ring_local for n, b in BACKENDS.items() if b.ring_local} == {
        "cudnn": "blockwise", "te": "blockwise"}


def test_option_errors_name_what_the_backend_takes(rng):
    q = jnp.zeros((1, 8, 2, 32))
    with pytest.raises(TypeError, match=r"'flash' does not take option\(s\) \['local'\]; "
                                        r"it takes \['block_kv', 'block_kv_bwd', 'block_kv_compute', "
                                        r"'block_q', 'block_q_bwd', 'interpret'\]"):
        attend(q, q, q, backend="flash", local="xla")
    with pytest.raises(TypeError, match=r"'ring' does not take .*\['ulysses_shards'\]"):
        attend(q, q, q, backend="ring", ulysses_shards=2)


@pytest.mark.parametrize("name,platform,inputs,fragments", [
    ("cudnn", CPU, {}, ["'cudnn' is unavailable", "no CUDA GPU visible: jax.devices() are cpu",
                        "install ditax[gpu] on a CUDA machine, or use backend='xla'"]),
    ("te", Platform("tpu", source="mesh"), {}, ["no CUDA GPU visible: the mesh's devices are tpu"]),
    ("cudnn", H100, dict(dtype=jnp.float32), ["needs float16 or bfloat16 q/k/v, got float32"]),
    ("cudnn", A100, dict(dtype=jnp.bfloat16, head_dim=192), ["K=192", "<= 128"]),
    ("cudnn", H100, dict(dtype=jnp.bfloat16, head_dim=36), ["K=36", "multiple of 8"]),
    ("flash", H100, {}, ["'flash' is unavailable", "targets TPU", "backend='cudnn' or 'te'"]),
    ("splash", H100, {}, ["'splash' is unavailable", "no GPU lowering", "backend='cudnn'"]),
])
def test_capability_refusals_name_backend_condition_and_fix(name, platform, inputs, fragments):
    why = BACKENDS[name].refusal(platform, **inputs)
    assert why is not None
    for f in fragments:
        assert f in why, (f, why)


@pytest.mark.parametrize("name,platform,inputs", [
    ("cudnn", H100, dict(dtype=jnp.bfloat16, head_dim=256)),
    ("cudnn", A100, dict(dtype=jnp.float16, head_dim=128)),
    ("flash", Platform("tpu"), dict(dtype=jnp.bfloat16)),
    ("flash", CPU, dict(dtype=jnp.float32)),                 # interpreted on CPU
    ("flash", H100, dict(interpret=True)),                   # explicitly interpreted
    ("splash", H100, dict(interpret=True)),                  # explicitly interpreted
    ("splash", CPU, {}),                                     # interpreted on CPU
    ("xla", Platform("tpu"), dict(dtype=jnp.float32, head_dim=36)),
])
def test_capabilities_accept_what_runs(name, platform, inputs):
    assert BACKENDS[name].refusal(platform, **inputs) is None


def test_interpret_follows_the_platform():
    flash, splash = BACKENDS["flash"], BACKENDS["splash"]
    assert flash.default_interpret(CPU) is True
    assert flash.default_interpret(Platform("tpu")) is False
    assert splash.default_interpret(CPU) is True and splash.default_interpret(H100) is False
    assert splash.default_interpret(Platform("tpu")) is False
    assert BACKENDS["xla"].default_interpret(CPU) is None


# ---------------------------------------------------------------- target platform


def test_target_platform_overrides_and_restores():
    assert platform_of() == CPU and platform_of().source == "jax.devices()"
    mesh = make_mesh({"context": 8})
    assert platform_of(mesh).name == "cpu" and platform_of(mesh).source == "mesh"
    with ditax.target_platform("tpu") as p:
        assert platform_of() is p and platform_of(mesh) is p
        with ditax.target_platform("gpu", compute_capability="9.0"):
            assert platform_of() == H100
        assert platform_of().name == "tpu"
    assert platform_of() == CPU
    with pytest.raises(ValueError, match="unknown target platform 'tpuu'"):
        with ditax.target_platform("tpuu"):
            pass
    with pytest.raises(ValueError, match="compute_capability=.* applies to cuda"):
        with ditax.target_platform("tpu", compute_capability=(9, 0)):
            pass


def test_auto_backend_and_interpret_under_target_platform():
    """What a model plans follows the target: auto and Pallas interpret mode."""
    acfg = AttentionConfig(backend="auto")
    assert plan_attention(acfg).self_attn.backend == "xla"
    with ditax.target_platform("tpu"):
        plan = plan_attention(acfg)
        assert plan.self_attn.backend == "splash" and plan.cross_attn.backend == "splash"
        assert plan.self_attn.options.interpret is False
        flash = plan_attention(AttentionConfig(backend="flash", block_q=512, block_kv=512))
        assert flash.self_attn.options == FlashOptions(512, 512, interpret=False)
    with ditax.target_platform("cuda", compute_capability=(9, 0)):
        assert plan_attention(acfg).self_attn.backend == "cudnn"


# ---------------------------------------------------------------- plans


def test_plan_from_config_routes_self_and_cross():
    mesh = make_mesh({"context": 8})
    acfg = AttentionConfig(backend="ulysses_ring", local="flash", ulysses_shards=2, block_q=16)
    plan = plan_attention(acfg, mesh, num_heads=8, head_dim=32, dtype="bfloat16")
    assert isinstance(plan, AttentionPlan) and plan.mesh is mesh and plan.dtype == "bfloat16"
    assert plan.self_attn.options == UlyssesRingOptions(local="flash", block_q=16, block_kv=128,
                                                        ulysses_shards=2, interpret=True)
    assert plan.cross_attn.backend == "flash"          # text K/V: the local kernel, no exchange
    assert plan.cross_attn.options == FlashOptions(block_q=16, block_kv=128, interpret=True)
    xla = plan_attention(AttentionConfig(backend="ulysses"), mesh)
    assert xla.self_attn.options == SequenceOptions(block_q=128, block_kv=128)   # CPU default
    assert xla.cross_attn.backend == "xla"
    assert hash(plan) == hash(plan_attention(acfg, mesh, num_heads=8, head_dim=32,
                                             dtype="bfloat16"))


def test_plan_call_matches_attend(rng):
    q = jnp.asarray(rng.standard_normal((2, 24, 2, 16)), jnp.float32)
    mask = jnp.asarray(rng.random((2, 24)) > 0.3)
    plan = plan_attention(AttentionConfig(backend="blockwise", block_kv=8))
    out = plan.self_attn(q, q, q, kv_mask=mask)
    ref = attend(q, q, q, backend="blockwise", kv_mask=mask, block_kv=8)
    assert jnp.array_equal(out, ref)


# ---------------------------------------------------------------- check_available


def test_check_available_refuses_cudnn_on_cpu():
    with pytest.raises(AttentionUnavailable) as e:
        check_available(AttentionConfig(backend="cudnn"), dtype="bfloat16", head_dim=128)
    msg = str(e.value)
    assert msg.startswith("attention.backend=cudnn: attention backend 'cudnn' is unavailable")
    assert "jax.devices() are cpu" in msg and "use backend='xla'" in msg


@pytest.mark.parametrize("acfg,dtype,head_dim,match", [
    (AttentionConfig(backend="cudnn"), "float32", 128, r"attention.backend=cudnn: .*got float32"),
    (AttentionConfig(backend="xla", cross_backend="te"), "bfloat16", 128,
     r"attention.cross_backend=te: .*transformer_engine.jax is not importable"),
    (AttentionConfig(backend="ulysses", local="flash"), "bfloat16", 128,
     r"attention.local=flash: .*targets TPU"),
    (AttentionConfig(backend="xla", cross_backend="splash"), "bfloat16", 128,
     r"attention.cross_backend=splash: .*no GPU lowering"),
    (AttentionConfig(backend="ring", local="splash"), "bfloat16", 128,
     r"attention.local=splash: .*no GPU lowering"),
])
def test_check_available_under_a_cuda_target(acfg, dtype, head_dim, match):
    mesh = make_mesh({"context": 8})
    with ditax.target_platform("cuda", compute_capability=(9, 0)):
        with pytest.raises(AttentionUnavailable, match=match):
            check_available(acfg, mesh=mesh, dtype=dtype, head_dim=head_dim)


def test_check_available_accepts_what_runs():
    mesh = make_mesh({"context": 8})
    check_available(AttentionConfig(), dtype="float32", head_dim=128)
    check_available(AttentionConfig(backend="ring", local="flash"), mesh=mesh,
                    dtype="float32", head_dim=64)
    with ditax.target_platform("cuda", compute_capability=(9, 0)):
        check_available(AttentionConfig(backend="ulysses", local="cudnn"), mesh=mesh,
                        dtype="bfloat16", head_dim=128)
        check_available(AttentionConfig(backend="auto"), dtype=jnp.bfloat16, head_dim=128)
        check_available(AttentionConfig(backend="auto"), dtype="float32", head_dim=128)
        check_available(AttentionConfig(backend="ring", local="cudnn"), mesh=mesh,
                        dtype="bfloat16", head_dim=128)       # ring steps: blockwise
    with ditax.target_platform("tpu"):
        check_available(AttentionConfig(backend="ulysses", local="flash", out_a2a="shard_major"),
                        mesh=mesh, dtype="bfloat16", head_dim=128)


def test_attend_refuses_from_the_mesh_platform_before_tracing():
    """A local backend on a mesh asks the mesh's platform (here overridden) first."""
    q = jnp.zeros((8, 8, 2, 64), jnp.bfloat16)
    with ditax.target_platform("tpu"):
        with pytest.raises(AttentionUnavailable, match="ditax.target_platform is 'tpu'"):
            jax.eval_shape(lambda q: attend(q, q, q, backend="cudnn",
                                            mesh=make_mesh({"fsdp": 8})), q)
