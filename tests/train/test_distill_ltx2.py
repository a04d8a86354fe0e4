"""DMD2 distillation of LTX-2 (ditax.train.distill) on both streams, from a tiny
``LTX2Pipeline`` folder: one step's critic and student losses equal the objective written out
here with the family's denoiser called directly (video and audio latents: noise, noising,
clean estimates, per-stream DMD gradients summed); the audio latents change the loss;
training resumes bit for bit; the exported student folder samples in 4 steps, with no guidance
pass, exactly what the trainer's own 4-step rollout gives from the same noise (the sigma table
the trainer uses is the pipeline's, LTX-2's terminal stretch included). One compiled step.

The random draws follow the step's documented stream (``fold_in(key, step)``, tag 1 + critic
update for the critic, tag 2 for the student; a stream's noise ``fold_in(noise key, 1)``)."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ditax.config import load_config
from ditax.parallel.mesh import make_mesh
from ditax.schedulers.flow import shift_sigma
from ditax.train import distill as D
from ditax.train.batches import BatchIterator
from ditax.train.loss import sample_sigmas

pytest.importorskip("torch")
pytest.importorskip("diffusers")

from ltx2_train_reference import write_ltx2_train_folder  # noqa: E402

pytestmark = pytest.mark.usefixtures("fast_compile")
ONE = dict(data=1, fsdp=1, context=1, tensor=1)
LATENT, AUDIO, TEXT = (8, 2, 2, 3), (5, 8), (16, 64)   # 12 video tokens, 5 audio tokens
# 1: the teacher without its CFG pass (one forward fewer to compile: 35 -> 13 s; the guided
# real score's rule is the streams' shared one, tested on Wan in test_distill.py)
GUIDANCE = 1.0


@pytest.fixture(scope="module")
def ltx2(tmp_path_factory):
    """The tiny pipeline folder (the teacher) and a dataset of random normalised latents of
    both streams, texts (video + audio text side by side) and the empty prompt's text."""
    from ditax.train.data_writer import DatasetWriter

    tmp = tmp_path_factory.mktemp("ltx2_distill")
    write_ltx2_train_folder(tmp / "pipe")
    r = np.random.default_rng(0)
    w = DatasetWriter(tmp / "ds", samples_per_file=4)
    for i in range(4):
        mask = (np.arange(TEXT[0]) < 5 + 3 * i).astype(np.uint8)
        w.add(r.standard_normal(LATENT).astype(np.float32),
              r.standard_normal(TEXT).astype(np.float32) * mask[:, None], mask,
              audio_latents=r.standard_normal(AUDIO).astype(np.float32))
    w.close(null_text=(r.standard_normal(TEXT).astype(np.float32) * 0.5,
                       (np.arange(TEXT[0]) < 2).astype(np.uint8)))
    return dict(folder=tmp / "pipe", ds=tmp / "ds", tmp=tmp)


def _cfg(ltx2, *extra):
    from ditax.models.ltx2.family import LTX2Family

    return load_config(None, [f"init_from={ltx2['folder']}", f"data.source={ltx2['ds']}",
                              "data.shuffle=false", "batch_size=2", "optim.learning_rate=1e-3",
                              "flow.timestep_sampler=logit_normal", "flow.dynamic_shift=true",
                              "distill.method=dmd2", "distill.critic_updates=1",
                              f"distill.guidance={GUIDANCE:g}",
                              "distill.backward_simulation=false", *extra],
                       family="ltx2", model=LTX2Family.folder_config(ltx2["folder"]))


@pytest.fixture(scope="module")
def one(ltx2):
    """The full-weight DistillTrainer on one device, bound to the data; its fresh state from
    the folder's transformer (numpy) and the first batch."""
    cfg = _cfg(ltx2)
    tr = D.DistillTrainer(cfg, make_mesh(ONE, jax.devices()[:1]))
    data = BatchIterator(cfg)
    tr.bind_data(data)
    batch = next(data)
    state = tr.init(tr.family.load_params(tr.family.weights_folder(cfg.init_from), tr.mesh))
    return tr, jax.tree.map(np.asarray, state), batch


_APPLY = {}


def velocity(tr, params, frozen, x, a, sigma, text, mask):
    """Both streams' velocities of the family's denoiser (``family.apply``; one jitted call)
    on video latents ``x`` and audio tokens ``a`` at noise level ``sigma [B]``."""
    if "f" not in _APPLY:
        def apply(params, frozen, x, a, t, text, mask):
            v, more = tr.family.apply(tr.model(params, frozen), x, t, text, mask,
                                      {"audio_latents": a})
            return v, more["audio_latents"]
        _APPLY["f"] = jax.jit(apply)
    t = np.asarray(sigma, np.float32) * np.float32(1000.0)
    host = [jax.tree.map(np.asarray, v) for v in (params, frozen, x, a)]
    return _APPLY["f"](*host, t, np.asarray(text), np.asarray(mask).astype(bool))


def expected_table(shift, terminal=0.1):
    """LTX-2's Euler table for the student's sigmas 1, .75, .5, .25: shifted, stretched to
    end at ``terminal``, then 0."""
    u = np.array([1.0, 0.75, 0.5, 0.25], np.float32)
    s = shift * u / (1 + (shift - 1) * u)
    s = 1 - (1 - s) * (1 - terminal) / (1 - s[-1])
    return np.concatenate([s, [0.0]])


def test_the_students_table_is_the_pipelines(one, ltx2):
    """The trainer's sigma table is the LTX-2 pipeline's Euler table for the same 4 steps at
    this size (the video token count's shift, stretched to the folder's terminal 0.1)."""
    from ditax.models.ltx2.training import resolution_shift
    from ditax.schedulers import load_scheduler

    tr = one[0]
    got = tr.schedule_table(LATENT)
    np.testing.assert_allclose(got, expected_table(resolution_shift(12)), rtol=1e-5, atol=1e-6)
    _, want = load_scheduler(ltx2["folder"]).with_mu(12).schedule(4, [1.0, 0.75, 0.5, 0.25])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert got[-2] == pytest.approx(0.1)


def _hand_objective(tr, state, fake_after, batch, key):
    """The step's critic loss and student loss terms written out (both streams)."""
    from ditax.models.ltx2.training import resolution_shift

    b = batch["latents"].shape[0]
    x_data, a_data = batch["latents"], batch["audio_latents"]
    text, mask = batch["text"], batch["text_mask"]
    params, frozen = state["params"], state["frozen"]
    shift = resolution_shift(12)
    sig = expected_table(shift)

    def student_x0(k_sample):
        """The student's clean estimate of both streams at a drawn step, from noised data."""
        k_step, k_noise = jax.random.split(k_sample)
        k = int(jax.random.randint(k_step, (), 0, 4))
        nx = np.asarray(jax.random.normal(k_noise, x_data.shape, jnp.float32))
        na = np.asarray(jax.random.normal(jax.random.fold_in(k_noise, 1), a_data.shape))
        s = np.float32(sig[k])
        xk, ak = (1 - s) * x_data + s * nx, (1 - s) * a_data + s * na
        vx, va = velocity(tr, params, frozen, xk, ak, np.full((b,), s), text, mask)
        return k, xk - s * np.asarray(vx), ak - s * np.asarray(va)

    # the critic (update 0): flow matching on the student's estimates of both streams
    k_sample, k_flow, _ = jax.random.split(jax.random.fold_in(jax.random.fold_in(key, 1), 0), 3)
    _, x0, a0 = student_x0(k_sample)
    k_sigma, k_noise = jax.random.split(k_flow)
    flow = tr.family.training_flow(LATENT)
    sigma = np.asarray(sample_sigmas(k_sigma, b, flow))
    ex = np.asarray(jax.random.normal(k_noise, x0.shape, jnp.float32))
    ea = np.asarray(jax.random.normal(jax.random.fold_in(k_noise, 1), a0.shape))
    sx, sa = sigma[:, None, None, None, None], sigma[:, None, None]
    vx, va = velocity(tr, state["fake"], frozen, (1 - sx) * x0 + sx * ex,
                      (1 - sa) * a0 + sa * ea, sigma, text, mask)
    critic = np.mean(np.mean((np.asarray(vx) - (ex - x0)) ** 2, axis=(1, 2, 3, 4))
                     + np.mean((np.asarray(va) - (ea - a0)) ** 2, axis=(1, 2)))
    # the student: DMD on each stream, summed
    k_sample, k_sigma, k_noise = jax.random.split(jax.random.fold_in(key, 2), 3)
    k, x0, a0 = student_x0(k_sample)
    sigma = np.asarray(shift_sigma(jax.random.uniform(k_sigma, (b,), jnp.float32, 0.02, 0.98),
                                   shift))
    sx, sa = sigma[:, None, None, None, None], sigma[:, None, None]
    ex = np.asarray(jax.random.normal(k_noise, x0.shape, jnp.float32))
    ea = np.asarray(jax.random.normal(jax.random.fold_in(k_noise, 1), a0.shape))
    xt, at = (1 - sx) * x0 + sx * ex, (1 - sa) * a0 + sa * ea
    cx, ca = velocity(tr, frozen, frozen, xt, at, sigma, text, mask)
    ux, ua = cx, ca                  # guidance 1: the teacher's conditional score alone
    if GUIDANCE != 1:
        null_text = np.broadcast_to(np.asarray(tr.null["text"])[None], text.shape)
        null_mask = np.broadcast_to(np.asarray(tr.null["text_mask"])[None], mask.shape)
        ux, ua = velocity(tr, frozen, frozen, xt, at, sigma, null_text, null_mask)
    fx, fa = velocity(tr, fake_after, frozen, xt, at, sigma, text, mask)
    terms = {}
    for name, z0, zt, s, c, u, f in (("latents", x0, xt, sx, cx, ux, fx),
                                     ("audio_latents", a0, at, sa, ca, ua, fa)):
        real = zt - s * (np.asarray(u) + GUIDANCE * (np.asarray(c) - np.asarray(u)))
        fake = zt - s * np.asarray(f)
        axes = tuple(range(1, z0.ndim))
        g = (fake - real) / np.abs(z0 - real).mean(axis=axes, keepdims=True)
        terms[name] = 0.5 * np.mean(g ** 2)
    return k, critic, terms


def test_one_step_equals_the_objective_on_both_streams(one):
    """One jitted step against the hand computation: the critic's flow loss on the student's
    video and audio estimates, the student's DMD loss of each stream and their sum."""
    tr, state, batch = one
    st, m = tr.step(jax.device_put(state, tr.state_sh), tr.put_batch(batch))
    key = jax.random.fold_in(jax.random.wrap_key_data(jnp.asarray(state["key"])), 0)
    k, critic, terms = _hand_objective(tr, state, st["fake"], batch, key)
    got = {"critic_loss": float(m["critic_loss"]), "latents": float(m["dmd_loss_latents"]),
           "audio_latents": float(m["dmd_loss_audio_latents"]), "loss": float(m["loss"])}
    want = {"critic_loss": critic, **terms, "loss": sum(terms.values())}
    print("ltx2 distill step (ours, by hand)", {n: (got[n], want[n]) for n in got})
    for n in got:
        assert abs(got[n] - want[n]) <= 2e-5 * abs(want[n]), (n, got[n], want[n])
    assert int(m["student_step"]) == k
    assert terms["audio_latents"] > 0.05 * got["loss"]     # the audio term is there
    moved = jax.tree.map(lambda a, b: float(np.max(np.abs(np.asarray(a) - b))),
                         st["params"], state["params"])
    assert max(jax.tree.leaves(moved)) > 0


def test_the_audio_latents_change_the_loss(one):
    """The same step on the same video latents with other audio latents: another student
    loss, in its audio term and in the video's (the streams attend to each other). (The
    critic's draw here is the student's first step, from pure noise: no data in it.)"""
    tr, state, batch = one
    _, m = tr.step(jax.device_put(state, tr.state_sh), tr.put_batch(batch))
    other = dict(batch, audio_latents=batch["audio_latents"] * 0.5 + 1.0)
    _, m2 = tr.step(jax.device_put(state, tr.state_sh), tr.put_batch(other))
    for k in ("dmd_loss_audio_latents", "dmd_loss_latents", "loss"):
        assert abs(float(m2[k]) - float(m[k])) > 1e-4 * abs(float(m[k])), k


def test_resume_is_bit_exact_and_the_export_samples_as_trained(one, ltx2):
    """``train`` 2 steps straight vs 1 + a resumed 1 (bit for bit, metrics with each
    stream's term); ``ditax export`` of the run is a pipeline folder whose
    ``ditax_sample.json`` samples the student in 4 steps without guidance, and its 4-step
    latents of a prompt (both streams) are the trainer's own rollout from the same noise."""
    import ditax
    from ditax.models.ltx2.audio.latents import pack_audio_latents
    from ditax.models.ltx2.text.encoder import encode_ltx2_prompt
    from ditax.train.export import export_run, plan_export
    from ditax.train.loop import train

    tr, state0, _ = one
    tmp = ltx2["tmp"]

    def cfg(steps):
        # the run's config names 8 devices (as a config must); the trainer runs on one
        return _cfg(ltx2, f"steps={steps}", f"output_dir={tmp / 'run'}", "checkpoint.every=1",
                    "checkpoint.async_save=false", "mesh.fsdp=2", "mesh.context=4")

    first = train(cfg(1), trainer=tr, progress=False)
    rest = train(cfg(2), trainer=tr, progress=False)
    state, losses, data = jax.device_put(state0, tr.state_sh), [], BatchIterator(cfg(2))
    for _ in range(2):
        state, m = tr.step(state, tr.put_batch(next(data)))
        losses.append(float(m["loss"]))
    assert rest.resumed_from == 1 and first.losses + rest.losses == losses
    for part in ("params", "fake", "opt", "fake_opt"):
        same = jax.tree.map(lambda a, b: bool(np.array_equal(np.asarray(a), np.asarray(b))),
                            state[part], rest.state[part])
        assert all(jax.tree.leaves(same)), part
    rows = [json.loads(x) for x in (tmp / "run" / "metrics.jsonl").read_text().splitlines()]
    print("ltx2 distill losses", [(r["loss"], r["dmd_loss_audio_latents"], r["critic_loss"])
                                  for r in rows])
    assert all(abs(r["dmd_loss_latents"] + r["dmd_loss_audio_latents"] - r["loss"])
               <= 1e-5 * r["loss"] for r in rows)
    # the exported student
    out = export_run(plan_export(tmp / "run", tmp / "student"), say=lambda *_: None)
    sample = json.loads((out / "ditax_sample.json").read_text())
    assert sample["num_inference_steps"] == 4 and sample["guidance_scale"] == 1.0
    pipe = ditax.load_pipeline(out)
    # the settings LTX-2's ditax_sample.json cannot hold yet (its pipeline family's
    # sample_file_keys): the student's own, as sample_settings gives them
    extra = {k: v for k, v in tr.sample_settings(LATENT).items() if k not in sample}
    prompt, n_text = "a dog barks at the sea", TEXT[0]
    video, audio_text, mask = encode_ltx2_prompt(pipe.text, [prompt], n_text)
    rng = np.random.default_rng(1)
    nx = rng.standard_normal((1, *LATENT)).astype(np.float32)
    na = rng.standard_normal((1, *AUDIO)).astype(np.float32)
    got = pipe(prompt, height=16, width=24, num_frames=5, max_sequence_length=n_text,
               latents=nx.transpose(0, 2, 3, 4, 1).reshape(1, 12, LATENT[0]),
               audio_latents=np.asarray(pipe.audio_vae.denormalize_latents(jnp.asarray(na))),
               output="latent", progress=False, **extra)
    assert pipe.last_stats["steps"] == 4 and pipe.last_stats["transformer_calls"] == 4
    got_x = np.asarray(pipe.vae.normalize_latents(jnp.asarray(got["video"])))
    got_a = np.asarray(pipe.audio_vae.normalize_latents(pack_audio_latents(
        jnp.asarray(got["audio"]))))
    batch = {"latents": jnp.asarray(nx), "audio_latents": jnp.asarray(na),
             "text": jnp.concatenate([video, audio_text], -1).astype(jnp.float32),
             "text_mask": jnp.asarray(mask)}
    params, frozen = rest.state["params"], rest.state["frozen"]
    v = tr.denoiser(lambda: tr.model(params, frozen), batch)
    want = tr.rollout(v, {"latents": batch["latents"], "audio_latents": batch["audio_latents"]},
                      jnp.asarray(tr.schedule_table(LATENT)), 4)
    for name, g, w in (("video", got_x, want["latents"]), ("audio", got_a,
                                                            want["audio_latents"])):
        w = np.asarray(w)
        err = float(np.linalg.norm(g - w) / np.linalg.norm(w))
        print(f"exported student vs trainer rollout, {name}: rel err {err:.1e}")
        assert err < 1e-4 and math.isfinite(err), (name, err)


def test_sampling_settings_lora_students_and_refusals(one, ltx2):
    """The student's settings turn every LTX-2 guidance off; a LoRA student (two adapter
    sets on one base, as for Wan) saves none with its adapters (LTX-2's pipelines read no
    settings from a LoRA, and would refuse a file that had them); the GAN head and
    first-frame conditioning are refused in one line."""
    from ditax.errors import ConfigError

    tr = one[0]
    assert tr.sample_settings(LATENT) == {
        "num_inference_steps": 4, "sigmas": [1.0, 0.75, 0.5, 0.25], "guidance_scale": 1.0,
        "audio_guidance_scale": 1.0, "stg_scale": 0.0, "audio_stg_scale": 0.0,
        "modality_scale": 1.0, "audio_modality_scale": 1.0}
    mesh = make_mesh(ONE, jax.devices()[:1])
    lora = D.DistillTrainer(_cfg(ltx2, "lora.rank=2"), mesh)
    assert lora.streams == ("audio_latents",) and lora.sample_settings(LATENT) is None
    for extra, words in ((("distill.gan_weight=0.5",), "distill.gan_weight=0"),
                         (("train.first_frame_p=0.1",), "train.first_frame_p=0")):
        with pytest.raises(ConfigError, match=words) as e:
            D.DistillTrainer(_cfg(ltx2, *extra), mesh)
        assert len(str(e.value).splitlines()) == 1
