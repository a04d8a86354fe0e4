"""DMD2 with a sparse student (``distill.method=dmd2 attention.sparsity=vsa``): the student runs
VSA (its gates trained), the real score (the frozen teacher) and the fake score (the critic)
run the dense twin of the student's graph on their own weights; the ``tiny`` preset on a grid
of 2 x 4 x 4 tokens in 1 x 2 x 2 tiles (8 tiles, 2 picked).

The references are independent modules: the dense model built from a dense attention config
(no gate parameters at all) and the VSA model built from the VSA config, each bound to the
state's weights and called through ``family.apply``."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ditax.config import ConfigError, load_config
from ditax.models.base import model_family
from ditax.parallel.mesh import make_mesh
from ditax.train import distill as D
from ditax.train.batches import BatchIterator
from ditax.train.loop import train
from latent_datasets import run_cfg, write_dataset
from sparse_reference import dense_attention, gates, perturb, reference, without_gates

pytestmark = pytest.mark.usefixtures("fast_compile")
ONE = dict(data=1, fsdp=1, context=1, tensor=1)
# the mesh keys only pass the runs' check on the 8 test devices: the trainers run one device
SPARSE = ("distill.method=dmd2", "distill.critic_updates=1", "distill.guidance=4",
          "flow.shift=3", "optim.learning_rate=1e-2", "batch_size=2", "mesh.fsdp=2",
          "mesh.tensor=4", "attention.sparsity=vsa", "attention.topk=2", "attention.tile=1,2,2")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("ds") / "latents", n=4, null=True)


@pytest.fixture(scope="module")
def one(dataset):
    cfg = run_cfg("unused", dataset, *SPARSE)
    tr = D.DistillTrainer(cfg, make_mesh(ONE, jax.devices()[:1]))
    data = BatchIterator(cfg)
    tr.bind_data(data)
    return tr, jax.tree.map(np.asarray, tr.init()), next(data)


def test_scores_are_the_dense_model_and_the_student_the_vsa_model(one, rng):
    """With random gates (so a score that read them would differ) and a critic moved off the
    teacher: teacher and critic equal the dense model on their weights (gates dropped), the
    student the VSA model; the student differs from dense (the test can tell them apart)."""
    tr, state, batch = one
    cfg = tr.cfg
    assert gates(state["params"]) and tr.score_graph is not None

    params, fake, frozen = (perturb(state[k], i) for i, k in enumerate(("params", "fake",
                                                                         "frozen")))
    x = rng.standard_normal(batch["latents"].shape).astype(np.float32)
    sigma = np.array([0.3, 0.8], np.float32)
    b = {k: jnp.asarray(v) for k, v in batch.items()}
    outputs = {
        "teacher": tr.denoiser(tr.teacher(params, frozen), b)(x, sigma)[0],
        "critic": tr.denoiser(lambda: tr.score_model(fake, frozen), b)(x, sigma)[0],
        "student": tr.denoiser(lambda: tr.model(params, frozen), b)(x, sigma)[0]}
    dense = dense_attention(cfg.attention)
    want = {"teacher": reference(cfg, dense, without_gates(frozen), x, sigma, batch),
            "critic": reference(cfg, dense, without_gates(fake), x, sigma, batch),
            "student": reference(cfg, cfg.attention, params, x, sigma, batch)}
    for name in outputs:
        np.testing.assert_allclose(np.asarray(outputs[name]), np.asarray(want[name]),
                                   rtol=1e-5, atol=1e-5, err_msg=name)
    student_dense = reference(cfg, dense, without_gates(params), x, sigma, batch)
    assert np.max(np.abs(np.asarray(student_dense) - np.asarray(want["student"]))) > 1e-3


@pytest.mark.parametrize("lora", [False, True])
def test_every_call_of_the_losses_runs_its_own_graph(dataset, lora):
    """Traced abstractly: the student's calls (its rollout and its estimate) run VSA, the
    teacher's (both guidance branches) and the critic's run dense, in the generator's loss
    and in the critic's; LoRA (student and critic two adapter sets on one base) alike."""
    extra = ("lora.rank=4",) if lora else ()
    cfg = run_cfg("unused", dataset, *SPARSE, *extra)
    tr = D.DistillTrainer(cfg, make_mesh(ONE, jax.devices()[:1]))
    data = BatchIterator(cfg)
    tr.bind_data(data)
    batch = tr.put_batch(next(data))
    seen = []
    apply = tr.family.apply

    def spy(module, *args, **kw):
        seen.append(module.attention.sparsity)
        return apply(module, *args, **kw)

    tr.family.apply = spy
    st = tr.abstract_state()
    sig = jnp.asarray(tr.schedule_table(batch["latents"].shape[1:]))
    key = jax.random.PRNGKey(0)
    jax.eval_shape(tr.generator_loss, st["params"], st["fake"], st["frozen"], batch, tr.null,
                   key, sig)
    # backward simulation's rollout + the estimate; the two guidance branches; the critic
    assert seen == ["vsa", "vsa", "none", "none", "none"], seen
    seen.clear()
    jax.eval_shape(tr.critic_loss, st["fake"], st["params"], st["frozen"], batch, key, sig)
    assert seen == ["vsa", "vsa", "none"], seen


def test_steps_train_the_students_gates_and_leave_the_teacher(one):
    """Two DMD2 steps: finite losses; the student's gates move off zero; the critic's stay
    zero (its dense twin never reads them: zero gradient); the teacher is unchanged."""
    tr, state, batch = one
    st = jax.device_put(state, tr.state_sh)
    for _ in range(2):
        st, m = tr.step(st, tr.put_batch(batch))
        for k in ("loss", "critic_loss", "dmd_scale", "grad_norm"):
            assert np.isfinite(float(m[k])), k
    assert all(not np.any(v) for v in gates(state["params"]).values())
    moved = [float(np.max(np.abs(np.asarray(v)))) for v in gates(st["params"]).values()]
    assert min(moved) > 0, moved
    assert all(not np.any(np.asarray(v)) for v in gates(st["fake"]).values())
    same = jax.tree.map(lambda a, b: bool(np.array_equal(np.asarray(a), b)), st["frozen"],
                        state["frozen"])
    assert all(jax.tree.leaves(same))
    assert any(not np.array_equal(np.asarray(a), b) for a, b in zip(
        jax.tree.leaves(st["fake"]), jax.tree.leaves(state["fake"])))


def test_resume_is_bit_exact(one, dataset, tmp_path):
    """2 steps straight vs 1 + a resumed 1 (the fixture's trainer: its step compiled once)."""
    tr = one[0]
    every = "checkpoint.every=1"
    full = train(run_cfg(tmp_path / "a", dataset, *SPARSE, "steps=2", every), trainer=tr,
                 progress=False)
    first = train(run_cfg(tmp_path / "b", dataset, *SPARSE, "steps=1", every), trainer=tr,
                  progress=False)
    rest = train(run_cfg(tmp_path / "b", dataset, *SPARSE, "steps=2", every), trainer=tr,
                 progress=False)
    assert rest.resumed_from == 1
    assert first.losses + rest.losses == full.losses
    assert all(np.isfinite(full.losses))
    for part in ("params", "fake", "opt", "fake_opt"):
        same = jax.tree.map(lambda a, b: bool(np.array_equal(np.asarray(a), np.asarray(b))),
                            full.state[part], rest.state[part])
        assert all(jax.tree.leaves(same)), part


def test_the_step_counts_the_students_calls_sparse_and_the_scores_dense(one):
    """MFU / plan FLOPs: with K=4, one critic update, guidance and backward simulation (1.5
    rollout forwards on average) the student runs 7 forwards' worth a step, the scores 6; the
    student's at the VSA model's cost, the scores' at the dense model's (no gate)."""
    from ditax.plan.core import train_step_flops

    tr = one[0]
    cfg = tr.cfg
    shape, t = (16, 2, 8, 8), 16
    assert tr.forwards() == (7.0, 6.0) and tr.flops_factor == pytest.approx(13 / 3)
    sparse = model_family(cfg.model, cfg.attention).flops_per_sample(shape, t)
    dense = model_family(cfg.model, dense_attention(cfg.attention)).flops_per_sample(shape, t)
    assert sparse != dense
    assert tr.sample_flops(shape, t) == pytest.approx((7 * sparse + 6 * dense) / 3)
    got = train_step_flops(cfg, tr.family, shape, tr.flops_factor, tr.sample_flops(shape, t))
    assert got == pytest.approx(cfg.batch_size * (7 * sparse + 6 * dense) / 3)


@pytest.mark.parametrize("extra, words", [
    (("attention.dense_steps=1",),
     r"attention.dense_steps=1: a sparse student trains every step sparse .*"
     r"set attention.dense_steps=0"),
    (("distill.method=self_forcing", "model.causal_chunk=1"),
     r"distill.method=self_forcing trains a block-causal student .*attention.sparsity=vsa "
     r".*set attention.sparsity=none"),
])
def test_what_a_sparse_student_cannot_do_is_one_line(extra, words):
    from ditax.train.trainers import make_trainer

    cfg = load_config("tiny", ["distill.method=dmd2", "attention.sparsity=vsa",
                               "attention.topk=2", *extra])
    with pytest.raises(ConfigError, match=words) as e:
        make_trainer(cfg, make_mesh(ONE, jax.devices()[:1]))
    assert "\n" not in str(e.value)
