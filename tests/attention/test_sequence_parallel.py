"""ulysses / ring / ulysses_ring on 8 fake CPU devices against the jnp reference.

Forward and gradient, with and without key masks, lengths that divide the context size and
lengths that need padding; the three Ulysses output exchanges compared bit for bit; the
kernel path observed through the plan and the executor's log; the plan under another target
platform; and every refusal with its message.
"""

import importlib.util
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ditax
from ditax.attention import attend, plan_sequence_parallel
from ditax.attention.reference import reference_attention
from ditax.parallel.mesh import make_mesh

HAS_BLOCKWISE = importlib.util.find_spec("ditax.attention.blockwise") is not None

# the jnp reference, jitted: one program per shape instead of one per eager op
_reference = jax.jit(lambda q, k, v, m: reference_attention(q, k, v, kv_mask=m))


@pytest.fixture(scope="module")
def mesh8():
    return make_mesh({"context": 8})


@pytest.fixture(scope="module")
def mesh_mixed():
    """Batch over fsdp=2, sequence over context=2, heads over tensor=2."""
    return make_mesh({"fsdp": 2, "context": 2, "tensor": 2})


def _inputs(rng, B, L, N, K, masked, Lk=None):
    Lk = L if Lk is None else Lk
    f = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)  # noqa: E731
    mask = None
    if masked:
        mask = jnp.asarray(rng.random((B, Lk)) > 0.3)
    return f(B, L, N, K), f(B, Lk, N, K), f(B, Lk, N, K), mask


def _run(backend, mesh, q, k, v, mask, **opts):
    return jax.jit(lambda q, k, v, m: attend(q, k, v, backend=backend, mesh=mesh, kv_mask=m,
                                             **opts))(q, k, v, mask)


# (backend, options, L, masked). L=64 divides 8 shards; L=60 / 50 need padding.
FORWARD_CASES = [
    ("ulysses", dict(local="xla"), 64, False),
    ("ulysses", dict(local="reference", out_a2a="chunked"), 60, True),
    ("ulysses", dict(local="blockwise", block_kv=16), 60, True),
    ("ulysses", dict(local="flash", out_a2a="shard_major", block_q=8, block_kv=8), 50, True),
    ("ring", dict(local="xla"), 60, True),
    ("ring", dict(local="blockwise", block_kv=8), 64, False),
    ("ring", dict(local="flash", block_q=8, block_kv=8), 64, True),
    ("ulysses_ring", dict(local="xla", ulysses_shards=2), 60, True),
    ("ulysses_ring", dict(local="reference", ulysses_shards=4, out_a2a="chunked"), 64, False),
    ("ulysses", dict(local="splash", out_a2a="chunked"), 60, True),
    ("ring", dict(local="splash"), 64, True),
]


@pytest.mark.parametrize("backend,opts,L,masked", FORWARD_CASES,
                         ids=[f"{b}-{o.get('local')}-{o.get('out_a2a', 'flat')}-U"
                              f"{o.get('ulysses_shards', '')}-L{L}-{'m' if m else 'nm'}"
                              for b, o, L, m in FORWARD_CASES])
def test_forward_matches_reference(rng, mesh8, backend, opts, L, masked):
    if opts.get("local") == "blockwise" and not HAS_BLOCKWISE:
        pytest.skip("ditax.attention.blockwise is not importable yet")
    q, k, v, mask = _inputs(rng, 2, L, 8, 32, masked)
    out = _run(backend, mesh8, q, k, v, mask, **opts)
    assert out.shape == q.shape and out.dtype == q.dtype
    np.testing.assert_allclose(out, _reference(q, k, v, mask), atol=3e-6)


GRAD_CASES = [
    ("ulysses", dict(local="xla", out_a2a="chunked"), True),
    ("ring", dict(local="xla"), True),
    ("ring", dict(local="flash", block_q=8, block_kv=8), True),
    ("ulysses_ring", dict(local="flash", ulysses_shards=2, out_a2a="shard_major", block_q=8,
                          block_kv=8), True),
    ("ring", dict(local="blockwise", block_kv=8), False),
    ("ulysses", dict(local="blockwise", block_kv=16), True),
    ("ulysses", dict(local="splash"), False),
    ("ulysses", dict(local="flash", out_a2a="shard_major", block_q=8, block_kv=8), False),
]


@pytest.mark.parametrize("backend,opts,masked", GRAD_CASES,
                         ids=[f"{b}-{o['local']}-{o.get('out_a2a', 'flat')}-{'m' if m else 'nm'}"
                              for b, o, m in GRAD_CASES])
def test_gradient_matches_reference(rng, mesh8, backend, opts, masked):
    """L=60 over 8 shards: padded; masked or unmasked keys; gradients w.r.t. q, k and v."""
    q, k, v, mask = _inputs(rng, 1, 60, 8, 32, masked=masked)
    w = jnp.asarray(rng.standard_normal(q.shape), jnp.float32)

    def loss(fn):
        return lambda q, k, v: jnp.sum(fn(q, k, v) * w)

    sp = lambda q, k, v: attend(q, k, v, backend=backend, mesh=mesh8, kv_mask=mask,  # noqa
                                **opts)
    g = jax.jit(jax.grad(loss(sp), argnums=(0, 1, 2)))(q, k, v)
    g_ref = jax.jit(jax.grad(loss(lambda q, k, v: reference_attention(q, k, v, kv_mask=mask)),
                             argnums=(0, 1, 2)))(q, k, v)
    for a, b in zip(g, g_ref):
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4)


def test_mixed_mesh_batch_heads_and_sequence(rng, mesh_mixed):
    """fsdp=2 (batch), context=2 (sequence), tensor=2 (heads): U divides N/tensor."""
    q, k, v, mask = _inputs(rng, 2, 20, 4, 32, masked=True)
    ref = _reference(q, k, v, mask)
    for backend, opts in (("ulysses", dict(local="xla")), ("ring", dict(local="xla"))):
        out = _run(backend, mesh_mixed, q, k, v, mask, **opts)
        np.testing.assert_allclose(out, ref, atol=3e-6, err_msg=backend)


EXECUTOR_LOG = "ditax.attention.sequence.execute"


def _kernel_path_traced(caplog) -> bool:
    """Whether the executor traced the shard-major kernel branch (it logs from the branch)."""
    paths = {r.getMessage().split(": ")[1].split(" (")[0] for r in caplog.records
             if r.name == EXECUTOR_LOG and r.levelno == logging.DEBUG}
    assert len(paths) == 1, paths
    return paths == {"shard-major kernel path"}


@pytest.mark.parametrize("backend,extra", [
    ("ulysses", {}),                                   # R = 1
    ("ulysses_ring", dict(ulysses_shards=4)),          # R = 2 ring steps
    ("ulysses_ring", dict(ulysses_shards=2)),          # R = 4: merges inside the loop
    ("ulysses_ring", dict(ulysses_shards=1)),          # R = 8, U = 1 (shard_major: 5-D carry)
], ids=["ulysses", "R2U4", "R4U2", "R8U1"])
def test_out_a2a_modes_bit_identical_and_kernel_path(rng, mesh8, backend, extra, caplog):
    """flat / chunked / shard_major give identical values; shard_major (and chunked when
    U > 1) really ran the shard-major kernel (the plan says so and the executor traced that
    branch), flat did not. L=50 needs padding, keys are masked. With R >= 3 this needs the
    ring merge inside the flash kernel (an outside jnp merge rounds differently per layout)."""
    q, k, v, mask = _inputs(rng, 1, 50, 8, 32, masked=True)
    U = extra.get("ulysses_shards", 8)
    outs = {}
    for mode in ("flat", "chunked", "shard_major"):
        opts = dict(local="flash", out_a2a=mode, block_q=8, block_kv=8, **extra)
        plan = plan_sequence_parallel(backend, mesh8, q_shape=q.shape, options=opts)
        kernel_path = mode == "shard_major" or (mode == "chunked" and U > 1)
        assert plan.kernel_path == kernel_path, (mode, plan.describe())
        assert (plan.ulysses, plan.ring, plan.padded_length) == (U, 8 // U, 64)
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger=EXECUTOR_LOG):
            outs[mode] = _run(backend, mesh8, q, k, v, mask, **opts)
        assert _kernel_path_traced(caplog) == kernel_path, mode
    assert jnp.array_equal(outs["flat"], outs["chunked"])
    assert jnp.array_equal(outs["flat"], outs["shard_major"])
    np.testing.assert_allclose(outs["flat"], _reference(q, k, v, mask),
                               atol=3e-6)


def test_chunked_exchange_bit_identical_around_any_local(rng, mesh8, caplog):
    """chunked with a non-flash kernel falls back to the chunked exchange (no kernel path),
    says so once at INFO with the reason, and still equals flat bit for bit."""
    q, k, v, mask = _inputs(rng, 2, 64, 8, 32, masked=True)
    plan = plan_sequence_parallel("ulysses", mesh8, q_shape=q.shape,
                                  options=dict(local="xla", out_a2a="chunked"))
    assert not plan.kernel_path and "needs local='flash'" in plan.reasons[0]
    flat = _run("ulysses", mesh8, q, k, v, mask, local="xla", out_a2a="flat")
    with caplog.at_level(logging.DEBUG, logger=EXECUTOR_LOG):
        chunked = _run("ulysses", mesh8, q, k, v, mask, local="xla", out_a2a="chunked")
        # traced again (nothing compiled: the log is written while tracing)
        jax.eval_shape(lambda q, k, v, m: attend(q, k, v, backend="ulysses", mesh=mesh8,
                                                 kv_mask=m, local="xla", out_a2a="chunked"),
                       q, k, v, mask)
    assert not _kernel_path_traced(caplog)
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(infos) <= 1    # logged once per process (an earlier test may have said it)
    assert all("chunked exchange around local=xla" in m for m in infos)
    assert jnp.array_equal(flat, chunked)


def test_cross_attention_keeps_queries_sharded(rng, mesh8):
    """Lk != Lq: text K/V replicated, no exchange; Lq=36 is padded to the 8 shards."""
    q, _, _, _ = _inputs(rng, 2, 36, 8, 32, masked=False)
    _, k, v, mask = _inputs(rng, 2, 12, 8, 32, masked=True)
    ref = _reference(q, k, v, mask)
    out = _run("ulysses", mesh8, q, k, v, mask, local="xla")
    np.testing.assert_allclose(out, ref, atol=3e-6)
    out = _run("ulysses", mesh8, q, k, v, mask, local="flash", block_q=8, block_kv=8)
    np.testing.assert_allclose(out, ref, atol=3e-6)
    plan = plan_sequence_parallel("ring", mesh8, q_shape=q.shape, kv_len=12,
                                  options=dict(local="flash"))
    assert plan.cross and not plan.kernel_path and plan.local.name == "flash"


# ---------------------------------------------------------------- plans


def test_plan_padding_blocks_and_grid(mesh8):
    """L=50 on 8 shards with flash blocks 16 clipped to the 7-token shards (-> 8)."""
    plan = plan_sequence_parallel("ulysses_ring", mesh8, q_shape=(2, 50, 8, 32),
                                  options=dict(local="flash", ulysses_shards=4, block_q=16,
                                               block_kv=16))
    assert (plan.ring, plan.ulysses, plan.shard_length, plan.padded_length) == (2, 4, 8, 64)
    assert (plan.block_q, plan.block_kv) == (8, 8) and plan.local.need_lse
    assert plan.grid.ring_axis != plan.grid.ulysses_axis
    assert plan.grid.mesh.devices.size == 8 and plan.interpret is True   # CPU: interpreted
    with pytest.raises(TypeError, match=r"'ring' does not take option\(s\) \['ulysses_shards'\]"):
        plan_sequence_parallel("ring", mesh8, q_shape=(2, 64, 8, 32),
                               options=dict(ulysses_shards=2))


def test_plan_follows_the_target_platform(mesh8):
    """Under target_platform("tpu") the flash kernels are compiled (not interpreted) and the
    shard-major path is taken; under "cuda" the flash kernel refuses, so chunked falls back
    and shard_major raises — decided from the plan, nothing runs on those platforms."""
    opts = dict(local="flash", out_a2a="chunked", block_q=8, block_kv=8)
    with ditax.target_platform("tpu"):
        plan = plan_sequence_parallel("ulysses", mesh8, q_shape=(1, 64, 8, 32), options=opts)
    assert plan.interpret is False and plan.local.options.interpret is False
    assert plan.kernel_path
    with ditax.target_platform("cuda", compute_capability=(9, 0)):
        plan = plan_sequence_parallel("ulysses", mesh8, q_shape=(1, 64, 8, 32), options=opts)
        assert not plan.kernel_path and "targets TPU" in plan.reasons[0]
        with pytest.raises(ValueError, match="shard_major' cannot run: .*targets TPU"):
            plan_sequence_parallel("ulysses", mesh8, q_shape=(1, 64, 8, 32),
                                   options=dict(opts, out_a2a="shard_major"))
    plan = plan_sequence_parallel("ulysses", mesh8, q_shape=(1, 64, 8, 32), options=opts)
    assert plan.interpret is True and plan.kernel_path          # back on CPU


# ---------------------------------------------------------------- refusals

def _tiny(L=16, N=8, K=32, Lk=None):
    z = jnp.zeros((1, L, N, K))
    kv = z if Lk is None else jnp.zeros((1, Lk, N, K))
    return z, kv, kv


@pytest.mark.parametrize("opts,match", [
    (dict(local="xla"), r"local='xla'.*needs local='flash'"),
    (dict(local="flash", block_q=12, L=256), r"block_q=12 is not a multiple of 8"),
    (dict(local="flash", K=36), r"head dim K=36"),
    (dict(local="flash", Lk=8), r"cross-attention \(Lq=16 != Lk=8\)"),
])
def test_shard_major_refuses_each_unmet_precondition(mesh8, opts, match):
    opts = dict(opts)
    q, k, v = _tiny(L=opts.pop("L", 16), K=opts.pop("K", 32), Lk=opts.pop("Lk", None))
    with pytest.raises(ValueError, match=match):
        attend(q, k, v, backend="ulysses", mesh=mesh8, out_a2a="shard_major", **opts)


def test_refusals(mesh8):
    q, k, v = _tiny()
    with pytest.raises(ValueError, match="unknown out_a2a='fast'.*flat, chunked, shard_major"):
        attend(q, k, v, backend="ulysses", mesh=mesh8, out_a2a="fast")
    with pytest.raises(ValueError, match="no meaning for pure ring"):
        attend(q, k, v, backend="ring", mesh=mesh8, out_a2a="chunked")
    q6, k6, v6 = _tiny(N=6)
    with pytest.raises(ValueError, match="6 heads per tensor shard are not divisible by the 8 "
                                         "Ulysses shards.*ulysses_ring"):
        attend(q6, k6, v6, backend="ulysses", mesh=mesh8)
    with pytest.raises(ValueError, match="ulysses_shards=3 does not divide mesh.context=8"):
        attend(q, k, v, backend="ulysses_ring", mesh=mesh8, ulysses_shards=3)
    with pytest.raises(ValueError, match="6 heads .* not divisible by the 4 Ulysses shards"):
        attend(q6, k6, v6, backend="ulysses_ring", mesh=mesh8, ulysses_shards=4)
    with pytest.raises(ValueError, match="needs mesh="):
        attend(q, k, v, backend="ring", mesh=None)
    with pytest.raises(ValueError, match="parallel backend"):
        attend(q, k, v, backend="ring", mesh=mesh8, local="ulysses")
