"""One training step, one DMD2 step and the demo model's video on the chip against the same
on the CPU, in float32 at the highest matmul precision (the suite's
``jax_default_matmul_precision``).

The steps are held to their float64 truth, evaluated op by op on the CPU
(tests/refs/f64_eval.py): loss and gradient norm within 1e-4 relative of the CPU's (the
issue's bound), each optimiser's gradient within 8× and the update within 2× the CPU's own
distance from the truth (tests/refs/step_truth.py: one rounding unit of error in every op
lands up to 4.2× and 1.8× as far, a bfloat16 matmul ~2000× and 19×; the update's bound is
loose because float32 storage of a 1e-5 step in a 0.2 weight alone moves it 3.9e-4). A bare
"update within 1e-4 relative of the CPU's" was below that storage: two exact float32 steps
fail it. Adam with ``eps=1``, no weight decay and a learning rate of 0.01 (updates well above a
weight's ulp), so that the first update, ``lr * g / (|g| + 1)``, follows the gradient: with
the default ``eps=1e-8`` it is ``lr * sign(g)`` wherever ``|g|`` is tiny, and a gradient of
1e-9 that rounds to the other side moves a weight by ``2 lr`` (seen on the chip: 4e-5 where
the steps were 5e-4)."""

import jax
import numpy as np
import pytest
from f64_eval import run_in_float64
from latent_datasets import run_cfg, write_dataset
from step_truth import check_step
from tpu_fixtures import chip, host  # noqa: F401  (fixtures)

pytestmark = pytest.mark.tpu
ONE = dict(data=1, fsdp=1, context=1, tensor=1)
SETTINGS = ("model.dtype=float32", "model.param_dtype=float32", "attention.backend=xla",
            "optim.eps=1.0", "optim.learning_rate=0.01", "optim.weight_decay=0.0")


def _close(chip_metric, cpu_metric) -> bool:
    return abs(chip_metric - cpu_metric) <= 1e-4 * abs(cpu_metric)


def test_one_training_step_equals_the_cpus(chip, host, tmp_path):
    """The tiny Wan's flow-matching step from the same weights and batch (see the module's
    docstring for the bounds). With the timestep sinusoid's frequency table computed on
    the device (before ditax.nn.embeddings.sinusoid_frequencies) the chip's update was
    2.8e-4 of its norm from the CPU's and a zero-initialised bias's 4.4e-4 of its step:
    what 16-ulp errors in that table's ``exp`` and division alone do on the CPU (2.8e-4,
    4.3e-4: the timesteps' ×1000 amplify them), while the CPU's float32 gradient is 5e-6
    from the float64 truth."""
    from ditax.parallel.mesh import make_mesh
    from ditax.train.batches import BatchIterator
    from ditax.train.step import Trainer

    cfg = run_cfg(tmp_path / "out", write_dataset(tmp_path / "ds"), *SETTINGS)
    batch = next(BatchIterator(cfg))
    init, runs = None, []
    for device in (host, chip):
        tr = Trainer(cfg, make_mesh(ONE, [device]))
        st = tr.init(init and init["params"])
        if init is None:
            init = jax.tree.map(np.asarray, st)
            truth = run_in_float64(tr._step_fn, st, tr.put_batch(batch))[0]
        st, m = tr.step(st, tr.put_batch(batch))
        runs.append((float(m["loss"]), float(m["grad_norm"]), jax.tree.map(np.asarray, st)))
    (l0, g0, s0), (l1, g1, s1) = runs
    assert _close(l1, l0) and _close(g1, g0), (l1, l0, g1, g0)
    check_step(s1, s0, truth, init, "params", "opt")


def test_the_demo_video_equals_the_cpus(chip, host):
    """The shipped demo model's video (float32, 2 steps) on the chip against the CPU's,
    within 1e-3 on [0, 1] pixels."""
    import ditax
    from ditax.parallel.mesh import make_mesh

    videos = []
    # at highest precision (issue 55: "within 1e-3 at highest precision"); a library call
    # does not enter model.precision's context, a command does
    for device in (host, chip):
        with jax.default_matmul_precision("highest"):
            pipe = ditax.load_pipeline(ditax.demo.model_path(), dtype="float32",
                                       mesh=make_mesh(ONE, [device]))
            videos.append(np.asarray(pipe("a red circle moves right", seed=0,
                                          num_inference_steps=2)))
    assert videos[0].shape == videos[1].shape
    assert np.abs(videos[0] - videos[1]).max() <= 1e-3


def test_one_dmd2_step_equals_the_cpus(chip, host, tmp_path):
    """A DMD2 step (two critic updates, then the student's, guidance 4) of the tiny Wan from
    the same state and batch: loss within 1e-4 relative, the student's and the critic's
    gradients and updates as the training step's."""
    from ditax.parallel.mesh import make_mesh
    from ditax.train.batches import BatchIterator
    from ditax.train.distill import DistillTrainer

    cfg = run_cfg(tmp_path / "out", write_dataset(tmp_path / "ds", n=4, null=True),
                  "distill.method=dmd2", "distill.critic_updates=2", "distill.guidance=4",
                  "flow.shift=3", *SETTINGS)
    init, runs = None, []
    for device in (host, chip):
        tr = DistillTrainer(cfg, make_mesh(ONE, [device]))
        data = BatchIterator(cfg)
        tr.bind_data(data)
        batch = next(data)
        if init is None:
            init = jax.tree.map(np.asarray, tr.init())
            truth = run_in_float64(tr._step_fn, jax.device_put(init, tr.state_sh),
                                   tr.put_batch(batch), tr.null)[0]
        st, m = tr.step(jax.device_put(init, tr.state_sh), tr.put_batch(batch))
        runs.append((float(m["loss"]), jax.tree.map(np.asarray, st)))
    (l0, s0), (l1, s1) = runs
    assert _close(l1, l0), (l1, l0)
    for part, opt in (("params", "opt"), ("fake", "fake_opt")):
        check_step(s1, s0, truth, init, part, opt)
