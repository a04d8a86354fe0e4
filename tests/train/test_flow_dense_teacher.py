"""Flow matching towards the dense teacher (``flow.target=dense_teacher``, issue 58 item 4): a
sparse model (VSA on the ``tiny`` preset: 2 x 4 x 4 tokens in 1 x 2 x 2 tiles, 8 tiles, 2
picked) is trained to reproduce its initial weights run dense, at the same noisy latents,
timestep and text, instead of the data's velocity.

The references are independent modules (:mod:`sparse_reference`): the VSA model built from the
VSA config on the student's weights, the dense model built from a dense config (no gate
parameters at all) on the teacher's."""

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from ditax.config import ConfigError, load_config, validate
from ditax.parallel.mesh import make_mesh
from ditax.train.batches import BatchIterator
from ditax.train.loop import RESUME_POLICY, train
from ditax.train.loss import sample_sigmas
from ditax.train.resume import ResumeMismatch
from ditax.train.step import Trainer
from latent_datasets import run_cfg, write_dataset
from sparse_reference import dense_attention, gates, perturb, reference, without_gates

pytestmark = pytest.mark.usefixtures("fast_compile")
ONE = dict(data=1, fsdp=1, context=1, tensor=1)
VSA = ("attention.sparsity=vsa", "attention.topk=2", "attention.tile=1,2,2", "flow.shift=3")
TEACHER = (*VSA, "flow.target=dense_teacher")
# the mesh keys only pass the runs' check on the 8 test devices: the trainers run one device
RUN = ("batch_size=2", "mesh.fsdp=2", "mesh.tensor=4")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("ds") / "latents", n=8)


@pytest.fixture(scope="module")
def batch(dataset):
    cfg = run_cfg("unused", dataset, *TEACHER, *RUN)
    return {k: jnp.asarray(v) for k, v in next(BatchIterator(cfg)).items()}


def one_device(cfg):
    return Trainer(cfg, make_mesh(ONE, jax.devices()[:1]))


@pytest.fixture(scope="module")
def full(dataset):
    """A full fine-tune's trainer (one device; its step compiled once for the module) and its
    loss, jitted."""
    tr = one_device(run_cfg("unused", dataset, *TEACHER, *RUN))
    return tr, jax.jit(tr.loss_fn)


def test_the_loss_is_the_vsa_student_against_the_dense_initial_model(full, batch):
    """A student moved off its initial weights (gates non-zero): the loss is the mean squared
    difference between the VSA model on the student's weights and the dense model on the
    frozen initial ones, at the data latents noised with the loss's own draws; not the data
    target's loss."""
    tr, loss_fn = full
    state = jax.tree.map(np.asarray, tr.init())
    assert tr.flops_factor == pytest.approx(4 / 3)      # the teacher's forward beside 3
    np.testing.assert_array_equal(*(np.concatenate([np.ravel(x) for x in jax.tree.leaves(
        state[k])]) for k in ("params", "frozen")))
    params, frozen = perturb(state["params"], 1), state["frozen"]
    assert min(float(np.abs(v).max()) for v in gates(params).values()) > 0
    key = jax.random.PRNGKey(3)
    loss, _ = loss_fn(params, batch, key, frozen)

    k_sigma, k_noise = jax.random.split(key)
    x0 = batch["latents"]
    sigma = sample_sigmas(k_sigma, x0.shape[0], tr.cfg.flow)
    noise = jax.random.normal(k_noise, x0.shape, jnp.float32)
    s = sigma[:, None, None, None, None]
    x_t = (1 - s) * x0 + s * noise
    cfg = tr.cfg
    student = reference(cfg, cfg.attention, params, x_t, sigma, batch)
    teacher = reference(cfg, dense_attention(cfg.attention), without_gates(frozen), x_t, sigma,
                        batch)
    want = float(jnp.mean(jnp.square(student - teacher)))
    assert float(loss) == pytest.approx(want, rel=1e-5)
    assert abs(float(jnp.mean(jnp.square(student - (noise - x0)))) - want) > 0.1 * want


def test_lora_teacher_is_the_base_run_dense(full, dataset, batch):
    """LoRA: the teacher is the frozen base under the dense graph, whatever the adapters hold;
    at step 0 (adapters a zero update) the loss is the full run's, which is not zero (VSA is
    not the dense model)."""
    tr, loss_fn = full
    lora = one_device(run_cfg("unused", dataset, *TEACHER, *RUN, "lora.rank=2"))
    fs, ls = tr.init(), lora.init()
    key = jax.random.PRNGKey(5)
    at_init = float(loss_fn(fs["params"], batch, key, fs["frozen"])[0])
    assert at_init > 0
    assert float(jax.jit(lora.loss_fn)(ls["params"], batch, key, ls["frozen"])[0]) == \
        pytest.approx(at_init, rel=1e-5)

    @jax.jit
    def teacher(params, frozen):
        module = lora.frozen_model(params, frozen, lora.teacher_graph)
        return lora.family.apply(module, batch["latents"], jnp.full((2,), 400.0),
                                 batch["text"], batch["text_mask"].astype(bool), None)

    moved = perturb(jax.tree.map(np.asarray, ls["params"]), 2)
    np.testing.assert_array_equal(np.asarray(teacher(moved, ls["frozen"])),
                                  np.asarray(teacher(ls["params"], ls["frozen"])))


def test_steps_move_the_student_not_the_teacher_and_resume_bit_exact(full, dataset, tmp_path):
    """4 steps straight vs 2 + a resumed 2: the student (its gates too) moves, the teacher
    stays the initial weights; the checkpoints leave the teacher out (rebuilt on resume from
    the base and checked); bit-exact resume; a resume asking for the data target refused."""
    tr = full[0]
    init = jax.tree.map(np.asarray, tr.init()["params"])

    def run(name, *extra):
        return train(run_cfg(tmp_path / name, dataset, *TEACHER, *RUN, *extra), trainer=tr,
                     progress=False)

    a = run("a", "steps=4")
    assert all(np.isfinite(a.losses)) and len(a.losses) == 4
    for x, y in zip(jax.tree.leaves(a.state["frozen"]), jax.tree.leaves(init)):
        np.testing.assert_array_equal(np.asarray(x), y)
    assert any(not np.array_equal(np.asarray(x), y)
               for x, y in zip(jax.tree.leaves(a.state["params"]), jax.tree.leaves(init)))
    assert min(float(np.abs(np.asarray(v)).max()) for v in gates(a.state["params"]).values()) > 0
    b1 = run("b", "steps=2")
    held = ocp.PyTreeCheckpointHandler().metadata(
        (tmp_path / "b" / "checkpoints" / "2" / "state").absolute())
    assert "frozen" not in getattr(held, "tree", held)
    b2 = run("b", "steps=4")
    assert b2.resumed_from == 2 and a.losses == b1.losses + b2.losses
    for x, y in zip(jax.tree.leaves(a.state), jax.tree.leaves(b2.state)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert RESUME_POLICY.kind("flow.target") == "refused"
    assert RESUME_POLICY.kind("flow.shift") == "notice"
    with pytest.raises(ResumeMismatch, match=r"flow.target: dense_teacher → data"):
        train(run_cfg(tmp_path / "b", dataset, *VSA, *RUN, "steps=6"), progress=False)


@pytest.mark.parametrize("extra, words", [
    ((), r"^flow.target=dense_teacher trains a sparse model to match its dense self, but "
         r"attention.sparsity=none \(nothing to match\); set attention.sparsity .* or "
         r"flow.target=data$"),
    (("attention.sparsity=vsa", "attention.topk=2", "distill.method=dmd2"),
     r"^flow.target=dense_teacher is a flow-matching objective; distill.method=dmd2 has its "
     r"own teacher .*; set flow.target=data$"),
])
def test_what_the_dense_teacher_cannot_do_is_one_line(extra, words):
    with pytest.raises(ConfigError, match=words) as e:
        validate(load_config("tiny", ["flow.target=dense_teacher", *extra]))
    assert "\n" not in str(e.value)


def test_an_unknown_target_names_the_choices():
    with pytest.raises(ConfigError, match=r"flow.target.*teacher.*data.*dense_teacher"):
        validate(load_config("tiny", ["flow.target=teacher"]))
