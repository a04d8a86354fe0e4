"""Self-Forcing distillation (ditax.train.self_forcing, issue 59 item 2) on the ``tiny`` preset:
the rollout inside the step is CausalSampler's sample; the gradient flows through the drawn
step of each chunk only (against a rollout written out here with explicit stop_gradients); a
step on fsdp2 x context4 equals one device; resume is bit-exact; an exported student is a
causal folder that ``ditax generate`` samples; the refusals are one line.

2 latent frames in chunks of 1 (2 chunks; the KV cache holds the sink = the first chunk), a
3-step student (a middle step has steps before and after it)."""

import json

import imageio.v2 as imageio
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ditax.config import ConfigError, load_config
from ditax.config.training import distill_sigmas
from ditax.parallel.mesh import make_mesh
from ditax.train.trainers import make_trainer
from ditax.train.batches import BatchIterator
from ditax.train.loop import train
from ditax.train.self_forcing import SelfForcingTrainer
from latent_datasets import run_cfg, write_dataset

pytestmark = pytest.mark.usefixtures("fast_compile")
ONE = dict(data=1, fsdp=1, context=1, tensor=1)
# the tiny preset as the demo's random pipeline folder has it (freq_dim 64): the teacher the
# runs start from and the base of the exported student. optim.eps=1: Adam's first update is
# then ~ lr x gradient, not lr x sign(gradient) (a gradient entry of ~1e-9 flips sign between
# meshes and moves a weight by 2 lr), so the mesh test compares the gradients' pull
SF = ("distill.method=self_forcing", "model.causal_chunk=1", "distill.steps=3",
      "distill.critic_updates=1", "distill.guidance=4", "flow.shift=3", "batch_size=2",
      "mesh.fsdp=2", "mesh.context=4", "model.freq_dim=64", "sample.context_chunks=1",
      "optim.eps=1")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("sf") / "latents", n=4, null=True)


def cfg_for(dataset, out="unused", *extra):
    return run_cfg(out, dataset, *SF, *extra)


@pytest.fixture(scope="module")
def one(dataset):
    """The trainer on one device, its fresh state (numpy; the student perturbed so that its
    steps matter) and a batch."""
    cfg = cfg_for(dataset)
    tr = make_trainer(cfg, make_mesh(ONE, jax.devices()[:1]))
    assert isinstance(tr, SelfForcingTrainer)
    data = BatchIterator(cfg)
    tr.bind_data(data)
    state = jax.tree.map(np.asarray, tr.init())
    state["params"] = jax.tree.map(lambda p: p * 1.02 + 0.01, state["params"])
    return tr, state, next(data)


def test_the_teacher_runs_bidirectionally(one):
    """The real score (the teacher) is the student's weights under the bidirectional graph
    (SelfForcingTrainer.score_model), not the causal one. A DistillTrainer refactor once built
    the teacher from the student's own (causal) graph: every self-forcing test still passed,
    and the mesh step's collectives deadlocked now and then on CPU."""
    from flax import nnx

    tr, state, batch = one
    teacher = tr.teacher(state["params"], state["frozen"])()
    assert nnx.graphdef(teacher) == tr._score_graph[0]
    assert nnx.graphdef(teacher) != nnx.graphdef(tr.model(state["frozen"], state["frozen"]))


def _rollout_inputs(tr, batch):
    b = {k: jnp.asarray(v) for k, v in batch.items()}
    b["text_mask"] = jnp.ones_like(b["text_mask"])      # CausalSampler takes no text mask
    noise = jax.random.normal(jax.random.PRNGKey(7), b["latents"].shape, jnp.float32)
    return b, noise, jnp.asarray(tr.schedule_table(b["latents"].shape[1:]))


def test_the_rollout_is_the_causal_samplers_sample(one):
    from ditax.models.wan import kv_cache
    from ditax.pipelines.causal import CausalSampler
    from ditax.schedulers.flow_match import FlowMatchEulerScheduler

    tr, state, batch = one
    b, _, sig = _rollout_inputs(tr, batch)
    # 4 chunks with sample.context_chunks=1: chunk 3 sees the sink and chunk 2 (1 evicted)
    noise = jax.random.normal(jax.random.PRNGKey(8), (2, 16, 4, 8, 8), jnp.float32)
    roll = jax.jit(tr.causal_rollout)
    got = np.asarray(roll(state["params"], state["frozen"], b, noise, sig, 1))
    sampler = CausalSampler(tr.model(state["params"], state["frozen"]), kv_cache,
                            FlowMatchEulerScheduler(shift=3.0), chunk=1, context_chunks=1)
    want = np.asarray(sampler.sample(b["text"], num_frames=4, latent_hw=(8, 8),
                                     num_inference_steps=3, latents=noise,
                                     sigmas=list(distill_sigmas(tr.cfg.distill))))
    assert sampler.last_stats["chunks"] == 4
    assert np.max(np.abs(got - want)) <= 1e-5, np.max(np.abs(got - want))
    # the drawn step changes the gradient, not the video; nor does taking none (the critic's)
    for other in (2, None):
        np.testing.assert_array_equal(
            got, np.asarray(roll(state["params"], state["frozen"], b, noise, sig, other)))


def _written_out(tr, params, frozen, b, noise, sig, k):
    """The rollout by hand: each chunk's S Euler steps, every call but step k's under
    stop_gradient, the clean chunk written at t = 0 without gradient."""
    from ditax.models.wan import kv_cache as kv

    sg, n = jax.lax.stop_gradient, noise.shape[0]
    text, mask = b["text"], b["text_mask"].astype(bool)
    cache = kv.init_cache(tr.model(sg(params), frozen), n, (1, 8, 8), 1)
    out = []
    for i in range(2):
        x = noise[:, :, i:i + 1]
        for j in range(3):
            t = jnp.full((n,), sig[j] * 1000.0)
            v, _ = kv.forward_chunk(tr.model(params if j == k else sg(params), frozen),
                                    x if j == k else sg(x), t, text, cache, text_mask=mask,
                                    write=False)
            x = x + (sig[j + 1] - sig[j]) * v
        out.append(x)
        _, cache = kv.forward_chunk(tr.model(sg(params), frozen), sg(x), jnp.zeros((n,)),
                                    text, cache, text_mask=mask, write=True)
    return jnp.concatenate(out, axis=2)


def test_the_gradient_flows_through_the_drawn_step_only(one):
    """Step 1 of 3 (steps before it and after it) against the rollout by hand; the drawn
    step moves the gradient."""
    tr, state, batch = one
    b, noise, sig = _rollout_inputs(tr, batch)
    w = jax.random.normal(jax.random.PRNGKey(1), noise.shape)
    frozen = state["frozen"]

    def flat(t):
        return np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree.leaves(t)])

    ours = jax.jit(jax.grad(lambda p, k: jnp.sum(w * tr.causal_rollout(p, frozen, b, noise,
                                                                       sig, k))))
    want = flat(jax.jit(jax.grad(lambda p: jnp.sum(w * _written_out(tr, p, frozen, b, noise,
                                                                    sig, 1))))(state["params"]))
    got = [flat(ours(state["params"], k)) for k in range(3)]
    scale = np.max(np.abs(want))
    assert scale > 1e-4 and np.max(np.abs(got[1] - want)) <= 1e-5 * scale
    for k in (0, 2):
        assert np.max(np.abs(got[k] - want)) > 1e-2 * scale, k


def test_a_long_rollouts_window_is_those_frames_of_the_long_video(one):
    """distill.rollout_chunks: the window (start chunk traced, frames static) of a 4-chunk
    rollout equals those chunks of the whole 4-chunk video (the prefix's cache is the one the
    window would have seen); start 0 with the whole length is the plain rollout."""
    tr, state, batch = one
    b, _, sig = _rollout_inputs(tr, batch)
    noise = jax.random.normal(jax.random.PRNGKey(9), (2, 16, 4, 8, 8), jnp.float32)
    p, f = state["params"], state["frozen"]
    full = np.asarray(jax.jit(tr.causal_rollout)(p, f, b, noise, sig, None))
    win = jax.jit(tr.causal_rollout, static_argnames="frames")
    for start in (0, 1, 2):
        got = np.asarray(win(p, f, b, noise, sig, 1, start=start, frames=2))
        assert got.shape == (2, 16, 2, 8, 8)
        np.testing.assert_allclose(got, full[:, :, start:start + 2], atol=1e-5, rtol=0)
        if start:   # not the video's first frames: the test can tell windows apart
            assert np.max(np.abs(got - full[:, :, :2])) > 1e-2
    np.testing.assert_allclose(np.asarray(win(p, f, b, noise, sig, 1, start=0, frames=4)),
                               full, atol=1e-5, rtol=0)


def test_long_rollouts_train_on_a_window_of_the_datas_length(dataset, one):
    """distill.rollout_chunks=4 on 2-frame data: the student's sample is the 2-frame window
    from window_start's chunk of its 4-chunk rollout; the start comes from the sample's key
    (every start drawn over keys); a step runs (the critic's samples alike) and differs from
    the same step without long rollouts."""
    tr0, state, batch = one
    cfg = cfg_for(dataset, "unused", "distill.rollout_chunks=4")
    tr = make_trainer(cfg, make_mesh(ONE, jax.devices()[:1]))
    tr.bind_data(BatchIterator(cfg))
    assert tr.rollout_share() == (2 + 1) / 2
    b = tr.put_batch(batch)
    sig = jnp.asarray(tr.schedule_table(b["latents"].shape[1:]))
    key = jax.random.PRNGKey(3)
    video, _, k, _ = jax.jit(tr.student_sample)(state["params"], state["frozen"], b, key, sig)
    assert video.shape == b["latents"].shape
    start = int(tr.window_start(key, 2))
    noise = jax.random.normal(jax.random.split(key)[1], (2, 16, 4, 8, 8), jnp.float32)
    full = np.asarray(jax.jit(tr.causal_rollout)(state["params"], state["frozen"], b, noise,
                                                 sig, None))
    np.testing.assert_allclose(np.asarray(video), full[:, :, start:start + 2], atol=1e-5,
                               rtol=0)
    starts = {int(tr.window_start(jax.random.PRNGKey(i), 2)) for i in range(40)}
    assert starts == {0, 1, 2}
    st, m = tr.step(jax.device_put(state, tr.state_sh), b)
    st0, m0 = tr0.step(jax.device_put(state, tr0.state_sh), tr0.put_batch(batch))
    assert np.isfinite(float(m["loss"])) and np.isfinite(float(m["critic_loss"]))
    assert float(m["loss"]) != float(m0["loss"])


@pytest.fixture(scope="module")
def on_mesh(dataset):
    """The trainer on fsdp2 x context4 (the runs' program)."""
    cfg = cfg_for(dataset)
    tr = make_trainer(cfg, make_mesh(cfg.mesh))
    tr.bind_data(BatchIterator(cfg))
    return tr


def test_a_step_on_fsdp2_context4_equals_one_device(one, on_mesh):
    tr, state, batch = one
    tr8 = on_mesh
    assert dict(tr8.mesh.shape) == {"data": 1, "fsdp": 2, "context": 4, "tensor": 1}
    st8, m8 = tr8.step(jax.device_put(state, tr8.state_sh), tr8.put_batch(batch))
    st, m = tr.step(jax.device_put(state, tr.state_sh), tr.put_batch(batch))
    assert abs(float(m["loss"]) - float(m8["loss"])) < 1e-5
    assert int(m["student_step"]) == int(m8["student_step"])
    for part in ("params", "fake"):     # the weights within 1e-5; the updates within 0.5%
        err = max(jax.tree.leaves(jax.tree.map(
            lambda a, c: float(np.max(np.abs(np.asarray(a) - np.asarray(c)))), st[part],
            st8[part])))
        moved = max(jax.tree.leaves(jax.tree.map(
            lambda a, c: float(np.max(np.abs(np.asarray(a) - c))), st[part], state[part])))
        assert err < 1e-5 and err <= 5e-3 * moved and moved > 1e-6, (part, err, moved)


@pytest.fixture(scope="module")
def runs(one, dataset, tmp_path_factory):
    """From the teacher (the random pipeline folder, init_from): 2 steps straight (``a``) and
    1 + a resumed 1 (``b``), a checkpoint every step, on the one-device trainer (its step
    compiled once; the mesh's step is the test above's). Before the rollout's video was
    constrained to the batch's sharding, XLA:CPU's in-process collectives of the 8-device
    step deadlocked about 1 step in 20 (a device at an all-gather, the seven others at the
    collective-permute of an involuntary resharding, aborted after 40 s); 60 steps in a row
    ran after it."""
    from random_pipeline import random_pipeline_folder

    root = tmp_path_factory.mktemp("runs")
    teacher = random_pipeline_folder(root / "teacher")
    tr = one[0]

    def run(name, steps):
        return train(cfg_for(dataset, root / name, f"steps={steps}", "checkpoint.every=1",
                             f"init_from={teacher}"), trainer=tr, mesh=tr.mesh,
                     progress=False)
    return root, run("a", 2), run("b", 1), run("b", 2)


def test_resume_is_bit_exact(runs):
    root, full, first, rest = runs
    assert rest.resumed_from == 1 and first.losses + rest.losses == full.losses
    for part in ("params", "fake", "opt", "fake_opt"):
        same = jax.tree.map(lambda a, c: bool(np.array_equal(np.asarray(a), np.asarray(c))),
                            full.state[part], rest.state[part])
        assert all(jax.tree.leaves(same)), part
    rows = [json.loads(x) for x in (root / "a" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(0 <= r["student_step"] < 3 and np.isfinite(r["critic_loss"]) for r in rows)


@pytest.mark.slow
def test_resume_with_long_rollouts_is_bit_exact(dataset, tmp_path):
    """distill.rollout_chunks=4: the window's start is drawn from the step's key, so 1 step +
    a resumed 1 equals 2 steps straight, bit for bit (losses and every state part)."""
    from random_pipeline import random_pipeline_folder

    teacher = random_pipeline_folder(tmp_path / "teacher")
    cfg = cfg_for(dataset, "unused", "distill.rollout_chunks=4")
    tr = make_trainer(cfg, make_mesh(ONE, jax.devices()[:1]))

    def run(name, steps):
        return train(cfg_for(dataset, tmp_path / name, "distill.rollout_chunks=4",
                             f"steps={steps}", "checkpoint.every=1", f"init_from={teacher}"),
                     trainer=tr, mesh=tr.mesh, progress=False)
    full, first, rest = run("a", 2), run("b", 1), run("b", 2)
    assert rest.resumed_from == 1 and first.losses + rest.losses == full.losses
    for part in ("params", "fake", "opt", "fake_opt"):
        same = jax.tree.map(lambda a, c: bool(np.array_equal(np.asarray(a), np.asarray(c))),
                            full.state[part], rest.state[part])
        assert all(jax.tree.leaves(same)), part


def test_an_exported_student_is_a_causal_folder_generate_samples(runs, capsys):
    from ditax.cli import main

    root = runs[0]
    folder = root / "student"
    assert main(["export", str(root / "a"), "--out", str(folder), "--link"]) == 0
    assert json.loads((folder / "transformer" / "config.json").read_text())["causal_chunk"] == 1
    own = json.loads((folder / "ditax_sample.json").read_text())
    assert own["num_inference_steps"] == 3 and own["context_chunks"] == 1
    assert own["guidance_scale"] == 1.0 and len(own["sigmas"]) == 3
    capsys.readouterr()
    frames = root / "frames"
    rc = main(["generate", "--model", str(folder), "--prompt", "a ball", "--frames", "13",
               "--height", "32", "--width", "32", "--no-progress", "--output",
               str(root / "out.mp4"), "--frames-dir", str(frames)])
    assert rc == 0, capsys.readouterr().err
    got = [imageio.imread(p) for p in sorted(frames.glob("frame_*.png"))]
    assert len(got) == 13 and got[0].shape == (32, 32, 3)    # 4 latent frames = 4 chunks


@pytest.mark.parametrize("extra, words", [
    ((), "set model.causal_chunk=K"),
    (("model.causal_chunk=1", "lora.rank=4"), "lora.rank=4"),
    (("model.causal_chunk=1", "distill.gan_weight=0.5"), "distill.gan_weight=0"),
    (("model.causal_chunk=1", "sample.cache=teacache"), "sample.cache=none"),
    (("model.causal_chunk=1", "distill.backward_simulation=false"), "own rollout"),
    (("model.causal_chunk=3",), "latent frames=2 are not a whole number of chunks"),
    (("model.causal_chunk=1", "distill.rollout_chunks=1"), "shorter than the data's 2 latent"),
])
def test_bad_combinations_are_one_line(dataset, extra, words):
    cfg = run_cfg("unused", dataset, "distill.method=self_forcing", *extra)
    with pytest.raises(ConfigError, match=words) as e:
        tr = make_trainer(cfg, make_mesh(ONE, jax.devices()[:1]))
        tr.bind_data(BatchIterator(cfg))
    assert "\n" not in str(e.value)


def test_long_rollouts_are_self_forcings_only(dataset):
    from ditax.config import validate

    cfg = run_cfg("unused", dataset, "distill.method=dmd2", "distill.rollout_chunks=4")
    with pytest.raises(ConfigError, match="needs distill.method=self_forcing"):
        validate(cfg, 1, training=True)


def test_a_family_without_a_causal_transformer_is_refused():
    cfg = load_config("flux-tiny", ["data.source=synthetic", "distill.method=self_forcing"])
    with pytest.raises(ConfigError, match="distill.method=self_forcing: model family 'flux' "
                                          "has no causal transformer"):
        make_trainer(cfg, make_mesh(ONE, jax.devices()[:1]))
