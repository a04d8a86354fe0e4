"""DMD2 distillation (ditax.train.distill) on the ``tiny`` preset: each piece against a slow
reference written out here, a step on a mesh against one device, exact resume, LoRA students
on one shared base, and the refusals.

The references call the family's denoiser directly (``family.apply`` on a module from the
state's weights) in plain Python loops; the random draws follow the step's documented stream
(``fold_in(key, step)``, then tag 1 + critic update index / tag 2 for the student)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ditax.config import ConfigError, load_config
from ditax.parallel.mesh import make_mesh
from ditax.schedulers.flow import shift_sigma
from ditax.train import distill as D
from ditax.train.trainers import make_trainer
from ditax.train.batches import BatchIterator
from ditax.train.data import DataSourceError
from ditax.train.loop import train
from ditax.train.loss import flow_loss
from latent_datasets import run_cfg, write_dataset
from mesh_steps import assert_same_step

pytestmark = pytest.mark.usefixtures("fast_compile")
ONE = dict(data=1, fsdp=1, context=1, tensor=1)
PARITY = ("model.num_attention_heads=8", "model.attention_head_dim=16")
DISTILL = ("distill.method=dmd2", "distill.critic_updates=2", "distill.guidance=4",
           "flow.shift=3", "optim.learning_rate=1e-3", "batch_size=2", "mesh.fsdp=2",
           "mesh.context=4", *PARITY)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("dd") / "latents", n=8, null=True)


def cfg_for(dataset, out="unused", *extra):
    return run_cfg(out, dataset, *DISTILL, *extra)


@pytest.fixture(scope="module")
def one(dataset):
    """A DistillTrainer on one device (the pieces are not about the mesh), its fresh state (as
    numpy) and a batch."""
    cfg = cfg_for(dataset)
    tr = D.DistillTrainer(cfg, make_mesh(ONE, jax.devices()[:1]))
    data = BatchIterator(cfg)
    tr.bind_data(data)
    batch = next(data)
    state = jax.tree.map(np.asarray, tr.init())
    return tr, state, batch


@pytest.fixture(scope="module")
def on_mesh(dataset, one):
    """The DistillTrainer on fsdp2 x context4 (the runs' program), bound to the same data."""
    cfg = cfg_for(dataset)
    tr = D.DistillTrainer(cfg, make_mesh(cfg.mesh))
    tr.bind_data(BatchIterator(cfg))
    return tr


def put(tr, state):
    return jax.device_put(state, tr.state_sh)


# ----------------------------------------------------------------------------------------------
# the formula


def test_dmd_gradient_and_loss_equal_the_formula(rng):
    for mask in (None, (rng.random((1, 1, 3, 1, 1)) > 0.3).astype(np.float32)):
        x0, real, fake = (rng.standard_normal((2, 4, 3, 2, 2)).astype(np.float32)
                          for _ in range(3))
        m = np.ones_like(x0) if mask is None else np.broadcast_to(mask, x0.shape)
        scale = (np.abs(x0 - real) * m).sum(axis=(1, 2, 3, 4), keepdims=True) / \
            m.sum(axis=(1, 2, 3, 4), keepdims=True)
        want = (fake - real) / scale
        got = np.asarray(D.dmd_gradient(jnp.asarray(x0), jnp.asarray(real), jnp.asarray(fake),
                                        None if mask is None else jnp.asarray(mask)))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        # the loss's gradient is the DMD gradient over the element count (kept elements)
        g = jax.grad(lambda x: D.dmd_loss(x, jnp.asarray(want),
                                          None if mask is None else jnp.asarray(mask)))(
            jnp.asarray(x0))
        np.testing.assert_allclose(np.asarray(g), want * m / m.sum(), rtol=1e-5, atol=1e-7)
    # a zero scale (x0 == real) gives no NaN
    z = jnp.zeros((1, 2, 1, 1, 1))
    assert np.isfinite(np.asarray(D.dmd_gradient(z, z, z + 1))).all()


def test_student_schedule_is_the_pipelines_euler_table():
    from ditax.schedulers.flow_match import FlowMatchEulerScheduler

    ts, sig = D.student_schedule((1.0, 0.75, 0.5, 0.25), 5.0)
    np.testing.assert_allclose(sig[:-1], shift_sigma(np.array([1, .75, .5, .25]), 5.0),
                               rtol=1e-6)
    assert sig[-1] == 0 and len(ts) == 4
    np.testing.assert_allclose(ts, [1000.0, 937.5, 833.333, 625.0], rtol=1e-5)
    want = FlowMatchEulerScheduler.from_config(
        {"_class_name": "FlowMatchEulerDiscreteScheduler", "shift": 5.0}).schedule(
        4, (1.0, 0.75, 0.5, 0.25))
    np.testing.assert_array_equal(sig, want[1])


# ----------------------------------------------------------------------------------------------
# the pieces against loops written out by hand


_APPLY = {}


def host(tree):
    """``tree``'s arrays as numpy arrays (tracers, e.g. under ``jax.vjp``, as they are)."""
    return jax.tree.map(lambda v: v if isinstance(v, jax.core.Tracer) else np.asarray(v), tree)


def hand_velocity(tr, params, frozen, batch, x, sigma):
    """The family's denoiser on ``x`` at noise level ``sigma`` (one jitted call: only the
    reference's speed, not its arithmetic, differs from an eager call)."""
    if id(tr) not in _APPLY:
        def apply(params, frozen, x, t, text, mask):
            return tr.family.apply(tr.model(params, frozen), x, t, text, mask, None)
        _APPLY[id(tr)] = jax.jit(apply)
    t = jnp.broadcast_to(jnp.asarray(sigma, jnp.float32) * 1000.0, (x.shape[0],))
    # the inputs as host arrays: one placement on every call, so one compile (an output of the
    # model comes back placed on the model's mesh, which would be another program's input)
    params, frozen, x, t = (host(v) for v in (params, frozen, x, t))
    return _APPLY[id(tr)](params, frozen, x, t, jnp.asarray(batch["text"]),
                          jnp.asarray(batch["text_mask"]).astype(bool))


def hand_rollout(tr, params, frozen, batch, noise, sig, k):
    """The student's Euler steps 0..k-1, then its clean estimate at step k."""
    x = noise
    for j in range(k):
        x = x + (sig[j + 1] - sig[j]) * hand_velocity(tr, params, frozen, batch, x, sig[j])
    return x - sig[k] * hand_velocity(tr, params, frozen, batch, x, sig[k])


def draws(key, n_steps, shape):
    k_step, k_noise = jax.random.split(key)
    k = int(jax.random.randint(k_step, (), 0, n_steps))
    return k, jax.random.normal(k_noise, shape, jnp.float32)


def test_backward_simulation_feeds_the_student_its_own_steps(one):
    tr, state, batch = one
    b = tr.put_batch(batch)
    sig = np.asarray(tr.schedule_table(batch["latents"].shape[1:]))
    # a trained-looking student: perturb the fresh one so its steps matter
    params = jax.tree.map(lambda p: p * 1.01 + 0.01, state["params"])
    # one compiled program for every draw (called eagerly, each call would trace and compile
    # its rollout loop again)
    sample = jax.jit(tr.student_sample)
    seen = set()
    for i in range(40):
        key = jax.random.PRNGKey(i)
        k, noise = draws(key, 4, batch["latents"].shape)
        if k in seen:
            continue
        seen.add(k)
        x0, _, got_k, _ = sample(params, state["frozen"], b, key, jnp.asarray(sig))
        assert int(got_k) == k
        want = hand_rollout(tr, params, state["frozen"], batch, noise, sig, k)
        np.testing.assert_allclose(np.asarray(x0), np.asarray(want), rtol=1e-4, atol=1e-5)
        if seen == {0, 1, 2, 3}:
            break
    assert seen == {0, 1, 2, 3}


def test_one_step_equals_critic_flow_matching_and_the_dmd_formula(one):
    """One jitted step: the critic's update is a plain flow-matching AdamW step on the
    student's sample; the student's gradient is the DMD formula pulled back through x̂0."""
    tr, state, batch = one
    st, m = tr.step(put(tr, state), tr.put_batch(batch))
    b = {k: jnp.asarray(v) for k, v in batch.items()}
    sig = np.asarray(tr.schedule_table(batch["latents"].shape[1:]))
    key = jax.random.fold_in(jax.random.wrap_key_data(jnp.asarray(state["key"])), 0)
    frozen, params = state["frozen"], state["params"]
    flow = tr.family.training_flow(tuple(batch["latents"].shape[1:]))
    # critic: two flow-matching updates, each on a fresh student sample
    fake, fake_opt = state["fake"], state["fake_opt"]

    @jax.jit
    @jax.grad
    def critic_grads(f, x0, k_flow):        # the plain flow-matching loss of the critic
        model = tr.model(f, frozen)
        return flow_loss(lambda x, t, text, mask: tr.family.apply(model, x, t, text, mask),
                         x0, b["text"], b["text_mask"].astype(bool), k_flow, flow)

    @jax.jit
    def adamw(grads, opt, f):           # the critic's optimiser update (one program)
        upd, opt = tr.critic_tx.update(grads, opt, f)
        return optax.apply_updates(f, upd), opt

    for i in range(2):
        k_sample, k_flow = jax.random.split(
            jax.random.fold_in(jax.random.fold_in(key, 1), i))
        k, noise = draws(k_sample, 4, batch["latents"].shape)
        x0 = hand_rollout(tr, params, frozen, batch, noise, sig, k)
        grads = critic_grads(host(fake), host(x0), k_flow)
        fake, fake_opt = adamw(host(grads), host(fake_opt), host(fake))
    err = jax.tree.map(lambda a, w: float(np.max(np.abs(np.asarray(a) - np.asarray(w)))),
                       st["fake"], fake)
    assert max(jax.tree.leaves(err)) < 2e-5
    # student: x̂0 by hand, the scores by hand, the DMD gradient, its pull-back
    k_sample, k_sigma, k_noise = jax.random.split(jax.random.fold_in(key, 2), 3)
    k, noise = draws(k_sample, 4, batch["latents"].shape)
    x_k = noise
    for j in range(k):                # the student's own earlier steps: inputs, no gradient
        x_k = x_k + (sig[j + 1] - sig[j]) * hand_velocity(tr, params, frozen, batch, x_k,
                                                          sig[j])
    x0, vjp = jax.vjp(lambda p: x_k - sig[k] * hand_velocity(tr, p, frozen, batch, x_k,
                                                             sig[k]), params)
    u = jax.random.uniform(k_sigma, (x0.shape[0],), jnp.float32, 0.02, 0.98)
    sv = shift_sigma(u, 3.0)
    s = sv[:, None, None, None, None]
    x_t = (1 - s) * x0 + s * jax.random.normal(k_noise, x0.shape, jnp.float32)
    null = {"text": np.broadcast_to(np.asarray(tr.null["text"])[None], batch["text"].shape),
            "text_mask": np.broadcast_to(np.asarray(tr.null["text_mask"])[None],
                                         batch["text_mask"].shape)}
    v_c = hand_velocity(tr, frozen, frozen, batch, x_t, sv)
    v_u = hand_velocity(tr, frozen, frozen, null, x_t, sv)
    real = np.asarray(x_t - s * (v_u + 4.0 * (v_c - v_u)))
    fake_x0 = np.asarray(x_t - s * hand_velocity(tr, fake, frozen, batch, x_t, sv))
    x0n = np.asarray(x0)
    g = (fake_x0 - real) / np.abs(x0n - real).mean(axis=(1, 2, 3, 4), keepdims=True)
    np.testing.assert_allclose(float(m["loss"]), 0.5 * np.mean(g ** 2), rtol=1e-4)
    (want,) = vjp(jnp.asarray(g / g.size))
    got, parts = jax.jit(jax.grad(tr.generator_loss, has_aux=True))(
        params, st["fake"], frozen, tr.put_batch(batch), tr.null, jax.random.fold_in(key, 2),
        jnp.asarray(sig))
    assert int(parts["student_step"]) == k
    for a, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        a, w = np.asarray(a), np.asarray(w)
        assert np.max(np.abs(a - w)) <= 1e-4 * np.max(np.abs(w)) + 1e-9
    assert max(float(np.max(np.abs(np.asarray(w)))) for w in jax.tree.leaves(want)) > 1e-4
    assert int(st["step"]) == 1 and int(m["student_step"]) == k
    assert np.isfinite(float(m["critic_loss"]))


# ----------------------------------------------------------------------------------------------
# meshes, runs, resume


def test_a_step_on_fsdp2_context4_equals_one_device(dataset):
    """One DMD2 step (two critic updates, then the student's) on fsdp2 x context4 against one
    device from the same state and batch: loss within 1e-5, every parameter of the student and
    the critic within 1e-3 of the largest step either took. Adam with ``eps=1``: its first update is then
    ``lr * g / (|g| + 1)``, following the gradient, where with the default ``eps=1e-8`` it is
    ``lr * g / (|g| + 1e-8)``, whose slope at a gradient near 1e-8 turns a 1e-10 difference in
    the order of a sum into ~1e-5 (seen: 1.25e-5 after an unrelated change of the timestep
    table's rounding): the mesh's arithmetic is what is compared, not that amplification. A learning rate of 0.1 keeps
    the steps (~2e-3) far above a float32 ulp of the weights (~1e-8), which the add rounds to."""
    cfg = cfg_for(dataset, "unused", "optim.eps=1.0", "optim.learning_rate=0.1")
    tr = D.DistillTrainer(cfg, make_mesh(ONE, jax.devices()[:1]))
    tr8 = D.DistillTrainer(cfg, make_mesh(cfg.mesh))
    data = BatchIterator(cfg)
    tr.bind_data(data)
    tr8.bind_data(BatchIterator(cfg))
    batch = next(data)
    state = jax.tree.map(np.asarray, tr.init())
    assert dict(tr8.mesh.shape) == {"data": 1, "fsdp": 2, "context": 4, "tensor": 1}
    assert len(tr.mesh.devices.flat) == 1
    st1, m1 = tr8.step(put(tr8, state), tr8.put_batch(batch))
    st, m = tr.step(put(tr, state), tr.put_batch(batch))
    assert_same_step(state, st, m, st1, m1)


def test_resume_is_bit_exact_and_metrics_hold_each_term(on_mesh, dataset, tmp_path):
    # 2 steps straight vs 1 + a resumed 1 (a checkpoint every step): each mesh step costs
    # ~0.7 CPU s, and the resume is the same code after 1 step as after 2
    every = "checkpoint.every=1"
    straight = cfg_for(dataset, tmp_path / "a", "steps=2", every)
    assert isinstance(make_trainer(straight, on_mesh.mesh), D.DistillTrainer)
    tr = on_mesh            # its step is compiled: the runs reuse it
    full = train(straight, trainer=tr, progress=False)
    half = cfg_for(dataset, tmp_path / "b", "steps=1", every)
    first = train(half, trainer=tr, progress=False)
    rest = train(cfg_for(dataset, tmp_path / "b", "steps=2", every), trainer=tr, progress=False)
    assert rest.resumed_from == 1
    assert first.losses + rest.losses == full.losses
    for part in ("params", "fake", "opt", "fake_opt"):
        same = jax.tree.map(lambda a, b: bool(np.array_equal(np.asarray(a), np.asarray(b))),
                            full.state[part], rest.state[part])
        assert all(jax.tree.leaves(same)), part
    rows = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for k in ("loss", "critic_loss", "critic_grad_norm", "dmd_scale", "student_step"):
        assert all(np.isfinite(r[k]) for r in rows), k


def test_lora_students_share_one_base_which_is_the_real_score(dataset, tmp_path):
    """A LoRA student on a diffusers Wan teacher: one base in the state, which with zeroed
    adapters is the real score; the run's files (diffusers / PEFT and ComfyUI keys) load in
    diffusers and in ditax as the same student, with its sampling settings."""
    from wan_reference import make_diffusers_wan

    _, teacher = make_diffusers_wan(tmp_path, heads=8, head_dim=16, layers=2, ffn=256,
                                    text_dim=64, in_ch=16)
    cfg = cfg_for(dataset, tmp_path / "lora", "lora.rank=4", "steps=2", f"init_from={teacher}",
                  "optim.learning_rate=1e-2")
    # one device: the mesh's step is test_a_step_on_fsdp2_context4_equals_one_device's
    tr = D.DistillTrainer(cfg, make_mesh(ONE, jax.devices()[:1]))
    tr.bind_data(BatchIterator(cfg))
    state = tr.init(tr.family.load_params(teacher, tr.mesh))     # what the run starts from
    base_bytes = sum(x.nbytes for x in jax.tree.leaves(state["frozen"]))
    adapter_bytes = sum(x.nbytes for x in jax.tree.leaves(state["params"]))
    total = sum(x.nbytes for x in jax.tree.leaves(state))
    # one base; the student, the critic and their Adam moments are adapters
    assert total < base_bytes + 7 * adapter_bytes + 64
    assert adapter_bytes * 4 < base_bytes
    # the real score is the base: the adapters zeroed change nothing at init (B = 0)
    batch = next(BatchIterator(cfg))
    x = jnp.asarray(batch["latents"])
    t = jnp.full((x.shape[0],), 500.0)
    text, mask = jnp.asarray(batch["text"]), jnp.asarray(batch["text_mask"]).astype(bool)

    def forward(module):    # jitted: an eager call compiles its layer scan again each time
        return jax.jit(lambda p, f: tr.family.apply(module(p, f), x, t, text, mask))

    real = forward(lambda p, f: tr.teacher(p, f)())
    base = real(state["params"], state["frozen"])
    moved = jax.tree.map(lambda p: p + 0.05, state["params"])
    student = forward(tr.model)(moved, state["frozen"])
    again = real(moved, state["frozen"])
    np.testing.assert_array_equal(np.asarray(base), np.asarray(again))
    assert float(jnp.max(jnp.abs(student - base))) > 1e-3
    result = train(cfg, trainer=tr, progress=False)
    assert result.step == 2 and all(np.isfinite(result.losses))
    assert (tmp_path / "lora" / "lora.safetensors").is_file()
    settings = json.loads((tmp_path / "lora" / "ditax_sample.json").read_text())
    assert settings["num_inference_steps"] == 4 and settings["guidance_scale"] == 1.0
    pytest.importorskip("peft")
    from diffusers import WanTransformer3DModel
    from lora_reference import load_into_diffusers
    from wan_reference import rel_err, run_diffusers

    import ditax

    rng = np.random.default_rng(0)
    inputs = (rng.standard_normal((1, 16, 2, 8, 8)).astype(np.float32),
              np.array([700.0], np.float32), rng.standard_normal((1, 16, 64)).astype(np.float32))
    plain = run_diffusers(WanTransformer3DModel.from_pretrained(teacher).eval(), *inputs)
    for name in ("lora.safetensors", "lora_comfyui.safetensors"):
        m = WanTransformer3DModel.from_pretrained(teacher).eval()
        load_into_diffusers(m, tmp_path / "lora" / name, "student", 1.0)
        want = run_diffusers(m, *inputs)
        assert rel_err(want, plain) > 1e-4          # the student moved
        got = np.asarray(ditax.load_transformer(
            teacher, loras=[(tmp_path / "lora" / name, 1.0)])(*inputs))
        assert rel_err(got, want) <= 1e-5, (name, rel_err(got, want))
    # the frozen base did not move
    same = jax.tree.map(lambda a, b: bool(np.array_equal(np.asarray(a), np.asarray(b))),
                        result.state["frozen"], state["frozen"])
    assert all(jax.tree.leaves(same))


# ----------------------------------------------------------------------------------------------
# refusals


def test_wrong_distill_settings_are_one_line(tmp_path):
    bad = {"distill.method=dmd3": "distill.method",
           "distill.steps=0": "distill.steps=0",
           "distill.sigmas=1,0.5": "distill.sigmas has 2 values",
           "distill.sigmas=0.5,1,0.25,0.1": "must decrease",
           "distill.guidance=0.5": "distill.guidance=0.5",
           "distill.t_min=0.99": "t_min < t_max",
           "distill.critic_updates=0": "distill.critic_updates=0"}
    from ditax.config import validate

    for override, words in bad.items():
        with pytest.raises(ConfigError, match=words):
            validate(load_config("tiny", ["distill.method=dmd2", override]))
    plain = write_dataset(tmp_path / "plain", n=2)     # no empty-prompt embedding
    cfg = cfg_for(plain)
    tr = D.DistillTrainer(cfg, make_mesh(ONE, jax.devices()[:1]))
    with pytest.raises(DataSourceError, match="distill.guidance=4 needs the empty prompt's "
                                              "embedding.*or set distill.guidance=1"):
        tr.bind_data(BatchIterator(cfg))


def test_sample_settings_are_the_trained_schedule(dataset):
    cfg = cfg_for(dataset, "x", "distill.shift=5", "distill.sigmas=1,0.75,0.5,0.25")
    tr = D.DistillTrainer(cfg, make_mesh(ONE, jax.devices()[:1]))
    got = D.sample_settings(cfg, tr.family, (16, 2, 8, 8))
    assert got == {"num_inference_steps": 4, "sigmas": [1.0, 0.75, 0.5, 0.25],
                   "guidance_scale": 1.0, "scheduler": "euler", "flow_shift": 5.0}
    # shift 0: the training shift (flow.shift=3 here)
    cfg = cfg_for(dataset, "x")
    assert D.sample_settings(cfg, tr.family, (16, 2, 8, 8))["flow_shift"] == 3.0


# ----------------------------------------------------------------------------------------------
# every family


# FLUX.1 (a per-sample condition entry: the pooled vector) and Wan 2.2 TI2V (the family's
# training inputs: a clean first frame, per-token timesteps, a loss mask); Wan I2V's CLIP
# condition takes the same path as the pooled vector
FAMILIES = {
    "flux": ("flux-tiny", ()),
    "wan_ti2v": ("tiny", ("model.vae=wan2.2", "model.expand_timesteps=true",
                          "model.in_channels=48", "model.out_channels=48", "data.height=64",
                          "data.width=64")),
}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_every_family_distils(name):
    """A step moves the student and the critic, finite; TI2V's student keeps the given first
    frame (its clean estimate there is the data's)."""
    preset, extra = FAMILIES[name]
    # the smallest program that runs each family's hooks (denoiser, inputs, condition)
    cfg = load_config(preset, ["data.source=synthetic", "distill.method=dmd2",
                               "distill.critic_updates=1", "distill.guidance=1",
                               "distill.backward_simulation=false", "batch_size=2", *extra])
    tr = D.DistillTrainer(cfg, make_mesh(ONE, jax.devices()[:1]))
    data = BatchIterator(cfg)
    tr.bind_data(data)
    batch = tr.put_batch(next(data))
    state = tr.init()
    before = jax.tree.map(np.asarray, {k: state[k] for k in ("params", "fake")})
    st, m = tr.step(state, batch)
    assert np.isfinite(float(m["loss"])) and np.isfinite(float(m["critic_loss"]))
    for part in ("params", "fake"):
        moved = jax.tree.map(lambda a, b: float(np.max(np.abs(np.asarray(a) - b))),
                             st[part], before[part])
        assert max(jax.tree.leaves(moved)) > 0, part
    if name == "wan_ti2v":
        sig = tr.schedule_table(batch["latents"].shape[1:])
        x0, _, _, mask = tr.student_sample(st["params"], st["frozen"], batch,
                                           jax.random.PRNGKey(3), sig)
        assert mask is not None
        np.testing.assert_array_equal(np.asarray(x0)[:, :, 0],
                                      np.asarray(batch["latents"])[:, :, 0])


def test_two_experts_each_train_their_own_steps_and_noise_levels(one, dataset):
    """Wan 2.2 A14B: the high-noise expert's student trains the steps at / above the
    boundary (timesteps 1000, 937.5 of 1000, 937.5, 833.3, 625 with shift 5) and critic levels
    there; the low-noise one the rest, on noised data."""
    _, state, batch = one
    common = ("distill.shift=5", "distill.sigmas=1,0.75,0.5,0.25")
    high = D.DistillTrainer(cfg_for(dataset, "x", *common, "distill.expert=high"),
                            make_mesh(ONE, jax.devices()[:1]))
    low = D.DistillTrainer(cfg_for(dataset, "x", *common, "distill.expert=low",
                                   "distill.backward_simulation=false"),
                           make_mesh(ONE, jax.devices()[:1]))
    sig = high.schedule_table(batch["latents"].shape[1:])
    assert high.expert_steps(sig) == (0, 1) and low.expert_steps(sig) == (2, 3)
    lo, hi = high.critic_range(3.0)          # the critic's levels use flow.shift=3
    assert abs(float(shift_sigma(lo, 3.0)) - 0.875) < 1e-6 and hi == 0.98
    assert abs(float(shift_sigma(low.critic_range(3.0)[1], 3.0)) - 0.875) < 1e-6
    b = high.put_batch(batch)
    sample = jax.jit(high.student_sample)          # one program for the 12 draws
    drawn = {int(sample(state["params"], state["frozen"], b, jax.random.PRNGKey(i),
                        jnp.asarray(sig))[2]) for i in range(12)}
    assert drawn == {0, 1}
    sigmas = np.asarray(high.critic_sigma(jax.random.PRNGKey(0), 256, (16, 2, 8, 8)))
    assert sigmas.min() >= 0.875 - 1e-6
    with pytest.raises(ConfigError, match="distill.backward_simulation=false"):
        from ditax.config import validate
        validate(load_config("tiny", ["distill.method=dmd2", "distill.expert=low"]))
    none = D.DistillTrainer(cfg_for(dataset, "x", "distill.shift=1", "distill.steps=2",
                                    "distill.sigmas=0.8,0.4", "distill.expert=high"),
                            make_mesh(ONE, jax.devices()[:1]))
    with pytest.raises(ConfigError, match="none of the student's timesteps"):
        none.expert_steps(none.schedule_table((16, 2, 8, 8)))


def test_gan_term_trains_a_head_on_the_critics_features(dataset, tmp_path):
    """distill.gan_weight: the student's loss is the DMD loss + w·softplus(-D); the critic's
    head and weights move; a resumed run continues the head bit for bit."""
    cfg = cfg_for(dataset, tmp_path / "g", "distill.gan_weight=0.5", "steps=2",
                  "checkpoint.every=1", "distill.critic_updates=1", "distill.sample_every=1")
    tr = D.DistillTrainer(cfg, make_mesh(ONE, jax.devices()[:1]))     # not about the mesh
    first = train(cfg, trainer=tr, progress=False)
    rows = [json.loads(x) for x in (tmp_path / "g" / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        assert abs(r["loss"] - (r["dmd_loss"] + 0.5 * r["gan_generator"])) < 1e-5
        assert 0 < r["gan_generator"] < 5
    head = jax.tree.map(np.asarray, first.state["head"])
    assert float(np.abs(head["w2"]).max()) > 0          # it starts at zero: it trained
    more = train(cfg_for(dataset, tmp_path / "g", "distill.gan_weight=0.5", "steps=3",
                         "checkpoint.every=1", "distill.critic_updates=1"),
                 trainer=tr, progress=False)
    assert more.resumed_from == 2 and len(more.losses) == 1
    # the student's previews each step (sample_every is free on resume: none here)
    import PIL.Image

    pngs = sorted(p.name for p in (tmp_path / "g" / "samples").iterdir())
    assert pngs == ["student_000001.png", "student_000002.png"]
    img = np.asarray(PIL.Image.open(tmp_path / "g" / "samples" / pngs[1]))
    assert img.shape[2] == 3 and img.shape[1] == 2 * img.shape[0] and img.std() > 10
    # a VACE model's call runs more than the blocks: refused, before anything compiles
    from ditax.models.base import model_family
    vace = load_config("tiny", ["model.vace_layers=0"])
    fam = model_family(vace.model, vace.attention)
    with pytest.raises(ConfigError, match="distill.gan_weight=0"):
        fam.apply_with_features(None, None, None, None, None)
