"""The float32 training and DMD2 steps against their float64 truth on the CPU: the bound the
chip tests hold a chip's step to (tests/refs/step_truth.py) admits another valid float32
evaluation and refuses a bfloat16 one; and, compiled for a TPU (deviceless), every dot and
convolution of both steps, forward and backward, runs at ``highest`` with no bfloat16 value
anywhere (end-to-end tier: the float64 evaluations run op by op, the TPU compiles take ~35 s);
and the one platform-dependent table the steps had, the timestep sinusoid's frequencies, is a
host constant."""

import re

import jax
import numpy as np
import pytest
from f64_eval import run_in_float64, run_jittered
from latent_datasets import run_cfg, write_dataset
from step_truth import check_step

from ditax.parallel.mesh import make_mesh

ONE = dict(data=1, fsdp=1, context=1, tensor=1)
# the chip tests' settings: Adam with eps=1 follows the gradient (tests/tpu/test_chip_steps.py)
STEP = ("model.param_dtype=float32", "attention.backend=xla", "optim.eps=1.0",
        "optim.learning_rate=0.01", "optim.weight_decay=0.0")
DMD2 = ("distill.method=dmd2", "distill.critic_updates=2", "distill.guidance=4", "flow.shift=3")


def _trainer(cfg, devices, put=jax.device_put):
    """``(trainer, host batch, the step's further arguments)`` on ``devices``; ``put``: how
    the DMD2 trainer's empty-prompt embedding is placed."""
    from unittest import mock

    from ditax.train.batches import BatchIterator
    from ditax.train.distill import DistillTrainer
    from ditax.train.step import Trainer

    if cfg.distill.method == "dmd2":
        tr = DistillTrainer(cfg, make_mesh(ONE, devices))
        data = BatchIterator(cfg)
        with mock.patch.object(jax, "device_put", put):
            tr.bind_data(data)
        return tr, next(data), (tr.null,)
    return Trainer(cfg, make_mesh(ONE, devices)), next(BatchIterator(cfg)), ()


def _host(x):
    return jax.tree.map(np.asarray, x)


def test_the_timestep_frequencies_are_a_host_constant():
    """The sinusoid's frequency table enters every step's program as a constant, not as an
    ``exp`` and a division on the device: timesteps reach 1000, so one ulp of a frequency
    is up to 1e-4 rad of the angle, and a TPU's ``exp`` moved the tiny Wan's float32 step
    on the chip by 2.8e-4 of its update (tests/tpu/test_chip_steps.py); the table is the
    float64 exponential of diffusers' float32 exponents, rounded once."""
    from ditax.nn import timestep_embedding
    from ditax.nn.embeddings import sinusoid_frequencies

    jaxpr = jax.make_jaxpr(lambda t: timestep_embedding(t, 256))(np.ones(2, np.float32))
    names = {e.primitive.name for e in jaxpr.eqns}
    assert not names & {"exp", "div", "log", "pow", "exp2"}, names
    exponent = np.float32(-np.log(10000.0)) * np.arange(128, dtype=np.float32) / np.float32(128)
    assert np.array_equal(sinusoid_frequencies(256),
                          np.exp(exponent.astype(np.float64)).astype(np.float32))
    t = np.array([999.0, 0.5], np.float32)
    angles = (t[:, None] * sinusoid_frequencies(256)).astype(np.float64)   # float32 products
    want = np.concatenate([np.cos(angles), np.sin(angles)], axis=-1)
    assert np.abs(np.asarray(timestep_embedding(t, 256)) - want).max() <= 1e-6


def test_the_float64_evaluation_widens_every_op():
    """:func:`run_in_float64` evaluates the float32 program in float64 through ``jit``,
    ``scan``, ``cond`` and ``while`` (``(x + 1e8) - 1e8``, 1e8 an argument, keeps ``x`` only
    there, float32 loses it), with the same random bits; :func:`run_jittered` stays float32, moving each
    result by at most its rounding units."""
    import jax.numpy as jnp

    def fn(x, big, key):
        def body(c, xi):
            return c + jax.lax.cond(xi > 0, lambda v: (v + big) - big, lambda v: v, xi), None

        s = jax.lax.scan(body, jnp.zeros((), jnp.float32), x)[0]
        n = jax.lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * 2), (0, s))[1]
        return jax.jit(lambda a: a)(n), jax.random.uniform(key, (4,))

    x, big, key = np.array([0.25, 0.5], np.float32), np.float32(1e8), jax.random.PRNGKey(0)
    ref32 = [np.asarray(v) for v in fn(x, big, key)]
    out64, u64 = run_in_float64(fn, x, big, key)
    assert (x[0] + big) - big == 0.0                            # float32 (numpy's) loses it
    assert out64.dtype == np.float64 and out64 == 6.0
    assert np.array_equal(u64, ref32[1].astype(np.float64))     # the same draws, widened
    out, u = run_jittered(fn, x, big, key, ulps=1.0)
    assert out.dtype == np.float32 and abs(float(out)) <= 1e-7 * 1e8 * 8


@pytest.mark.slow
@pytest.mark.parametrize("dmd2", [False, True], ids=["flow", "dmd2"])
def test_the_bound_takes_a_valid_float32_step_and_refuses_bfloat16(tmp_path, dmd2):
    """From the same state and batch: the CPU's float32 step is within 2e-5 of the float64
    truth in its gradients; an evaluation with every arithmetic result off by a full
    rounding unit passes :func:`check_step` against it; the ``model.dtype=bfloat16`` step
    fails it."""
    data = write_dataset(tmp_path / "ds", n=4, null=True)
    cfgs = [run_cfg(tmp_path / "out", data, f"model.dtype={dt}", *STEP, *(DMD2 if dmd2 else ()))
            for dt in ("float32", "bfloat16")]
    cpu = jax.devices("cpu")[:1]
    (tr, batch, extra), (tb, batch_b, _) = _trainer(cfgs[0], cpu), _trainer(cfgs[1], cpu)
    init = _host(tr.init())
    put = (lambda t: jax.device_put(init, t.state_sh))
    b, bb = tr.put_batch(batch), tb.put_batch(batch_b)
    f32 = _host(tr.step(put(tr), b)[0])
    truth = run_in_float64(tr._step_fn, put(tr), b, *extra)[0]
    other = run_jittered(tr._step_fn, put(tr), b, *extra, ulps=1.0)[0]
    bf16 = _host(tb.step(put(tb), bb)[0])
    parts = (("params", "opt"), ("fake", "fake_opt")) if dmd2 else (("params", "opt"),)
    for part, opt in parts:
        errors = check_step(other, f32, truth, init, part, opt)
        assert errors["cpu"]["grad"] <= 2e-5, errors
        with pytest.raises(AssertionError):
            check_step(bf16, f32, truth, init, part, opt)


def _abstract(tree, sharding):
    return jax.ShapeDtypeStruct(tree.shape, tree.dtype, sharding=sharding)


def _tpu_step_hlo(cfg) -> str:
    """The step of ``cfg`` compiled for one v5e chip (deviceless): its optimised HLO."""
    import os

    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies

    import ditax

    dev = topologies.get_topology_desc(platform="tpu", topology_name="v5e:1x1",
                                       chips_per_host_bounds=(1, 1, 1)).devices[0]
    with ditax.target_platform("tpu"):
        tr, batch, extra = _trainer(   # (no device to put the empty prompt on)
            cfg, [dev], lambda x, s: jax.tree.map(lambda a: _abstract(a, s), x))
        abstract = {k: _abstract(v, tr.batch_sh[k]) for k, v in batch.items()}
        return tr.lower(abstract, *extra).compile().as_text()


@pytest.mark.slow
@pytest.mark.parametrize("dmd2", [False, True], ids=["flow", "dmd2"])
def test_the_tpu_step_runs_every_dot_at_highest(tmp_path, dmd2):
    """``model.dtype=float32`` (precision ``auto``, the suite's ``highest``): the v5e program
    of the step has its dots (convolutions, on a TPU) all at ``operand_precision=highest``
    and no bfloat16 array at all — forward, backward and optimiser."""
    from ditax.plan.targets import has_libtpu

    if not has_libtpu():
        pytest.skip("needs libtpu (the [tpu] extra) to compile for a TPU deviceless")
    data = write_dataset(tmp_path / "ds", n=4, null=True)
    cfg = run_cfg(tmp_path / "out", data, "model.dtype=float32", *STEP, *(DMD2 if dmd2 else ()))
    hlo = _tpu_step_hlo(cfg)
    dots = re.findall(r"= \S+ (?:convolution|dot)\([^\n]*", hlo)
    assert len(dots) >= 60, len(dots)
    low = [d for d in dots if "operand_precision={highest,highest}" not in d]
    assert not low, low[:2]
    assert "bf16[" not in hlo
