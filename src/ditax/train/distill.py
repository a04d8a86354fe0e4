"""Few-step distillation: DMD2 (distribution matching distillation, with the two-time-scale
critic rule and backward simulation) of any model family's denoiser into a K-step student.

Three denoisers take part, all the family's transformer:

- the **student** (generator ``G``), initialised from the teacher; the train state's
  ``params`` (a LoRA run: its adapters);
- the **real score**: the frozen teacher, classifier-free guided at ``distill.guidance``
  with the empty prompt's embedding as the unconditional branch (the dataset's
  ``null_text``, what the pipelines' negative branch sees);
- the **fake score** (critic ``F``), initialised from the teacher; ``fake`` in the state,
  trained with the flow-matching loss on the student's samples.

With LoRA (``lora.rank > 0``) the student and the critic are two adapter sets on **one**
frozen copy of the base weights (``frozen``), which with its adapters zeroed is the real
score: distillation holds one model's weights. A full-weight student holds three copies
(student, critic, and the frozen teacher in ``frozen``).

The student samples with Euler on the flow sigmas ``s_0 > ... > s_{K-1} > s_K = 0``
(:func:`student_schedule`, the very table the pipelines' Euler scheduler builds from
``sigmas`` and the shift): ``x_{j+1} = x_j + (s_{j+1} - s_j)·G(x_j, s_j)``. Its clean
estimate at step ``k`` is ``x̂0 = x_k - s_k·G(x_k, s_k)``.

One train step (one student update) is:

1. ``distill.critic_updates`` critic updates, each on a fresh student sample: the plain
   flow-matching loss of :func:`ditax.train.loss.flow_loss` with the student's ``x̂0`` (no
   gradient to the student) as the clean latents;
2. one student update. A step index ``k`` is drawn uniformly from ``0..K-1``; with backward
   simulation the student runs its own steps ``0..k-1`` from pure noise (no gradient) to make
   ``x_k``, else ``x_k`` is the data latents noised to ``s_k``. Then ``x̂0`` (with gradient),
   noised again to a critic level ``σ`` (uniform in ``[t_min, t_max]``, then the training
   shift): ``x_σ = (1-σ)·x̂0 + σ·ε``. The real and fake scores give clean estimates
   ``r = x_σ - σ·v_real`` and ``f = x_σ - σ·F(x_σ)``; the distribution-matching gradient is
   ``g = (f - r) / mean|x̂0 - r|`` (per sample) and the loss ``½·mean((x̂0 - sg(x̂0 - g))²)``,
   whose gradient with respect to ``x̂0`` is ``g`` over the element count.

Every draw comes from ``fold_in(key, step)``, so a resumed run repeats the stream bit for bit.
A family's ``training_inputs`` (Wan 2.2 TI2V: the clean first frame, per-token timesteps,
a loss mask) apply to every denoiser call, the data latents giving the condition frame.

A family that denoises further streams beside its latents (``noised_entries``; LTX-2's audio
latents) is distilled on all of them at once (:mod:`ditax.train.distill_streams`): the
student's noise, Euler steps and clean estimates, the noising to ``σ`` and the scores cover
every stream at one ``σ`` per sample; the distribution-matching gradient and loss are per
stream and summed, as the flow loss sums its streams; the critic's flow loss is
:func:`~ditax.train.loss.joint_flow_loss` on the student's estimates of every stream. The
student's sigma table and sampling settings: :mod:`ditax.train.distill_schedule`; the GAN
head: :mod:`ditax.train.distill_gan`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from ditax.config import Config, ConfigError
from ditax.config.training import distill_sigmas
from ditax.models.base import model_family
from ditax.schedulers.flow import shift_sigma
from ditax.train import distill_streams as S
from ditax.train.adapters import AdapterSplit
from ditax.train.distill_gan import GanHead
from ditax.train.distill_schedule import (sample_settings, sampling_terminal, student_schedule,
                                          student_shift)
from ditax.train.distill_streams import dmd_gradient, dmd_loss
from ditax.train.loss import NUM_TRAIN_TIMESTEPS, flow_loss, joint_flow_loss
from ditax.train.step import TrainerBase, batch_shardings, make_optimizer, opt_shardings

_TAG_CRITIC, _TAG_STUDENT = 1, 2


def _copy_tree(tree):
    return jax.tree.map(jnp.copy, tree)


class DistillTrainer(GanHead, TrainerBase):
    """The :class:`~ditax.train.step.Trainer` of a distillation run: same interface
    (``init``, ``step``, ``put_batch``, ``abstract_state``, ``adapters``), a state with the
    critic (``fake``, ``fake_opt``) beside the student (``params``, ``opt``) and the frozen
    teacher or base (``frozen``)."""

    def __init__(self, cfg: Config, mesh):
        if cfg.distill.method != "dmd2":
            raise ConfigError(f"distill.method={cfg.distill.method!r}: DistillTrainer runs "
                              f"distill.method=dmd2")
        self.cfg = cfg
        self.mesh = mesh
        self.family = model_family(cfg.model, cfg.attention, cfg.flow)
        self.family.check_flow()
        if self.family.trained_params(cfg.train) is not None:
            raise ConfigError(f"distill.method=dmd2 distils the whole denoiser; this model "
                              f"trains a part of it (train.vace_trainable="
                              f"{cfg.train.vace_trainable}); set train.vace_trainable=all")
        # further streams denoised with the latents (LTX-2's audio): distilled alike
        # (ditax.train.distill_streams)
        self.streams = tuple(self.family.noised_entries())
        if self.streams and cfg.distill.gan_weight > 0:
            raise ConfigError(f"distill.gan_weight={cfg.distill.gan_weight:g}: the GAN head "
                              f"reads one stream's block features, but model family "
                              f"{self.family.name!r} denoises {', '.join(self.streams)} beside "
                              f"its latents; set distill.gan_weight=0")
        if getattr(cfg.train, "first_frame_p", 0.0):
            raise ConfigError(f"train.first_frame_p={cfg.train.first_frame_p:g}: distillation "
                              f"samples text-to-video students and draws no first-frame "
                              f"conditioning; set train.first_frame_p=0")
        self.terminal = sampling_terminal(cfg, self.family)
        self.adapters = self.split = None
        if cfg.lora.rank > 0:
            self.split = self.adapters = AdapterSplit(self.family, cfg, mesh)
            self.params_abstract = self.split.train_abstract
            self.params_sh = self.split.train_sh
            frozen_abstract, self.frozen_sh = self.split.frozen_abstract, self.split.frozen_sh
        else:
            self.graphdef, abs_state = nnx.split(self.family.abstract(mesh))
            self._abs_state = abs_state
            self.params_abstract = nnx.to_pure_dict(abs_state)
            self.params_sh = self.family.param_shardings(self.params_abstract, mesh)
            frozen_abstract, self.frozen_sh = self.params_abstract, self.params_sh
        self.frozen_abstract = frozen_abstract
        # a checkpoint leaves the frozen teacher / base out: a resume rebuilds it from
        # init_from (or the seed) and checks it (ditax.train.frozen_base)
        self.rebuilt = ("frozen",)
        d = cfg.distill
        self.tx, self.schedule = make_optimizer(cfg.optim, cfg.steps)
        critic_optim = dataclasses.replace(
            cfg.optim, learning_rate=d.critic_learning_rate or cfg.optim.learning_rate,
            decay_steps=(cfg.optim.decay_steps or cfg.steps) * d.critic_updates,
            warmup_steps=cfg.optim.warmup_steps * d.critic_updates)
        self.critic_tx, self.critic_schedule = make_optimizer(critic_optim,
                                                              cfg.steps * d.critic_updates)
        rep = NamedSharding(mesh, P())
        opt_abs = jax.eval_shape(self.tx.init, self.params_abstract)
        opt_sh = opt_shardings(opt_abs, self.params_sh, mesh)
        self.gan = d.gan_weight > 0
        self._shapes = None     # (latent_shape, text_shape), from bind_data
        self.state_sh = {"params": self.params_sh, "opt": opt_sh,
                         "fake": self.params_sh, "fake_opt": None,     # set by _critic_opt
                         "frozen": self.frozen_sh, "step": rep, "key": rep}
        if self.gan:            # the discriminator head: small, replicated; its optimiser
            self.state_sh["head"] = rep     # state is the critic's (one state for the pair)
        if not self.gan:
            self._critic_opt()
        self.condition_keys = tuple(self.family.condition_shapes(
            (self.family.latent_channels, 1, 1, 1)))
        self.batch_sh = batch_shardings(mesh, self.condition_keys)
        self.null = None      # the empty prompt's embedding, read with the first batch
        self._jit = self._init_jit = None

    def _critic_trained_abstract(self):
        """What the critic's optimiser trains: its weights, with the GAN term (weights, head)."""
        if not self.gan:
            return self.params_abstract
        return (self.params_abstract, jax.eval_shape(self._head_init))

    def _critic_opt(self):
        """The critic optimiser state's shardings (the head's leaves replicated)."""
        abs_ = jax.eval_shape(self.critic_tx.init, self._critic_trained_abstract())
        self.state_sh["fake_opt"] = opt_shardings(abs_, self.params_sh, self.mesh)

    @property
    def _step(self):
        if self._jit is None:
            if self.state_sh["fake_opt"] is None:
                self._critic_opt()
            rep = NamedSharding(self.mesh, P())
            self._jit = jax.jit(self._step_fn, in_shardings=(self.state_sh, self.batch_sh, rep),
                                out_shardings=(self.state_sh, rep), donate_argnums=(0,))
        return self._jit

    @property
    def flops_factor(self) -> float:
        """Transformer work of one step over one training step's (forward + backward = 3
        forwards): per critic update the rollout (on average (K-1)/2 forwards), the
        student's estimate and the critic's forward + backward; per student update the
        rollout, the student's forward + backward, the teacher (2 forwards with guidance)
        and the critic."""
        d = self.cfg.distill
        sim = (d.steps - 1) / 2 if d.backward_simulation else 0.0
        critic = sim + 1 + 3
        student = sim + 3 + (2 if d.guidance != 1 else 1) + 1
        return (d.critic_updates * critic + student) / 3

    def sample_settings(self, latent_shape) -> dict | None:
        """How the student is sampled (:func:`sample_settings`), saved with its LoRA: there
        only the keys the family's pipelines read from a LoRA (``lora_sample_keys``; None
        where they read none, LTX-2's: its student LoRA is saved without settings, which a
        pipeline would refuse, and is sampled with :func:`sample_settings` given)."""
        settings = sample_settings(self.cfg, self.family, latent_shape)
        if self.adapters is None:
            return settings
        from ditax.pipelines.family import pipelines_of

        keys = pipelines_of(self.family.name).lora_sample_keys
        return {k: v for k, v in settings.items() if k in keys} or None

    # -- state -------------------------------------------------------------------------------

    def abstract_state(self) -> dict:
        def sds(x, s):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)

        opt_abs = jax.eval_shape(self.tx.init, self.params_abstract)
        critic_abs = jax.eval_shape(self.critic_tx.init, self._critic_trained_abstract())
        if self.state_sh["fake_opt"] is None:
            self._critic_opt()
        return {"params": jax.tree.map(sds, self.params_abstract, self.params_sh),
                "opt": jax.tree.map(sds, opt_abs, self.state_sh["opt"]),
                "fake": jax.tree.map(sds, self.params_abstract, self.params_sh),
                "fake_opt": jax.tree.map(sds, critic_abs, self.state_sh["fake_opt"]),
                "frozen": jax.tree.map(sds, self.frozen_abstract, self.frozen_sh),
                "step": jax.ShapeDtypeStruct((), jnp.int32, sharding=self.state_sh["step"]),
                "key": jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=self.state_sh["key"]),
                **self._head_abstract()}

    def init(self, params: dict | None = None) -> dict:
        """Fresh state: the student and the critic both start as the teacher (``params``: its
        weights, e.g. ``init_from``; None: random from ``cfg.seed``); LoRA: two fresh adapter
        sets (zero update) on the frozen base."""
        if self._init_jit is None:      # built once: each train() call (a resume) inits again
            self._init_jit = (jax.jit(self._random_params, out_shardings=self.params_sh),
                              jax.jit(_copy_tree, out_shardings=self.params_sh))
        random_params, copy = self._init_jit
        if self.split is not None:
            student, frozen = self.split.init(params)
        else:
            if params is None:
                params = random_params()
            else:
                params = jax.device_put(params, self.params_sh)
            student = copy(params)
            frozen = params
        fake = copy(student)
        head = jax.device_put(self._head_init(), self.state_sh["head"]) if self.gan else None
        if self.state_sh["fake_opt"] is None:
            self._critic_opt()
        key = jax.random.key_data(jax.random.PRNGKey(self.cfg.seed ^ 0x5EED)).astype(jnp.uint32)
        rep = self.state_sh["step"]
        return {"params": student,
                "opt": jax.jit(self.tx.init, out_shardings=self.state_sh["opt"])(student),
                "fake": fake,
                "fake_opt": jax.jit(self.critic_tx.init, out_shardings=self.state_sh["fake_opt"])(
                    (fake, head) if self.gan else fake),
                "frozen": frozen,
                "step": jax.device_put(jnp.zeros((), jnp.int32), rep),
                "key": jax.device_put(key, rep), **({"head": head} if self.gan else {})}

    def teacher(self, state_params: dict, frozen: dict):
        """A thunk building the real score's module (the frozen teacher)."""
        if self.split is not None:
            zeros = jax.tree.map(jnp.zeros_like, state_params)
            return lambda: self.model(zeros, frozen)
        return lambda: self.model(frozen, frozen)

    # -- batches -----------------------------------------------------------------------------

    def bind_data(self, data) -> None:
        """Read the empty prompt's embedding of ``data`` (a :class:`BatchIterator`): the
        teacher's unconditional branch; before anything loads or compiles."""
        from ditax.train.data import null_text

        d = self.cfg.distill
        self._shapes = (tuple(data.latent_shape), tuple(data.text_shape))
        # an expert has steps at every shape the batches have (a resolution-dependent
        # shift moves the student's timesteps per bucket)
        for shape in getattr(data, "latent_shapes", (data.latent_shape,)):
            self.expert_steps(self.schedule_table(shape))
        if d.guidance == 1.0:
            self.null = {}
            return
        text, mask, extra = null_text(self.cfg, data.text_shape,
                                      needed_by=f"distill.guidance={d.guidance:g}")
        self.null = jax.device_put({"text": text, "text_mask": mask, **extra},
                                   NamedSharding(self.mesh, P()))

    # -- the pieces of a step (each a function of explicit inputs, tested one by one) --------

    def denoiser(self, module, batch):
        """``v(z, sigma [B]) -> (velocity, loss mask or None)`` of ``module`` on joint latents
        ``z`` (:mod:`ditax.train.distill_streams`: the latents, or with further streams the
        dict of them all, velocities alike), the batch's text and condition, the family's
        training inputs applied (the data latents give a condition frame). ``module``: a
        thunk that builds the NNX module, called inside each call (a module must not cross
        into a loop's trace)."""
        condition = {k: batch[k] for k in self.condition_keys} or None
        x_data = batch["latents"]
        text, mask = batch["text"], batch["text_mask"].astype(bool)
        streams = self.streams

        def v(z, sigma):
            t = sigma * NUM_TRAIN_TIMESTEPS
            x_in, t_in, loss_mask = self.family.training_inputs(S.main(z), x_data, t, condition)
            if not streams:
                return self.family.apply(module(), x_in, t_in, text, mask, condition), loss_mask
            # the noisy streams in place of the batch's clean ones
            noisy = {**condition, **{n: z[n] for n in streams}}
            out, more = self.family.apply(module(), x_in, t_in, text, mask, noisy)
            return {S.MAIN: out, **{n: more[n] for n in streams}}, loss_mask
        return v

    def guided(self, module, batch, null, guidance: float):
        """The teacher's classifier-free guided velocity ``v_u + g·(v_c - v_u)`` (every
        stream at the one scale), ``v_u`` on the empty prompt (``null``: its text, mask and
        extra condition entries)."""
        cond = self.denoiser(module, batch)
        if guidance == 1.0:
            return cond
        b = batch["latents"].shape[0]
        uncond_batch = dict(batch)
        for k, val in null.items():
            if k in batch:
                uncond_batch[k] = jnp.broadcast_to(val[None], (b,) + val.shape).astype(
                    batch[k].dtype)
        uncond = self.denoiser(module, uncond_batch)

        def v(x, sigma):
            vc, m = cond(x, sigma)
            vu, _ = uncond(x, sigma)
            return jax.tree.map(lambda c, u: u + guidance * (c - u), vc, vu), m
        return v

    def clean(self, x, v, sigma, mask, x_data):
        """``x - σ·v`` on every stream; the main latents' elements outside the loss mask (a
        given frame) from the data."""
        return S.clean(x, v, sigma, mask, x_data)

    def rollout(self, student_v, noise, sig, k):
        """The student's Euler steps ``0..k-1`` from ``noise`` (``k`` traced): ``x_k``."""
        b = S.main(noise).shape[0]

        def body(j, x):
            v, _ = student_v(x, jnp.full((b,), sig[j], jnp.float32))
            return S.euler(x, v, sig[j + 1] - sig[j])
        return jax.lax.fori_loop(0, k, body, noise)

    def student_sample(self, params, frozen, batch, key, sig):
        """``(x̂0, x_k, k, loss mask)``: the student's clean estimate at a random step ``k``
        from its own earlier steps (backward simulation) or from noised data; ``x̂0`` carries
        the gradient with respect to ``params``, the input ``x_k`` none. ``x̂0`` and ``x_k``
        are joint latents (every stream the family denoises)."""
        k_step, k_noise = jax.random.split(key)
        sig = jnp.asarray(sig, jnp.float32)
        steps = jnp.asarray(self.expert_steps(self.schedule_table(batch["latents"].shape[1:])),
                            jnp.int32)
        k = steps[jax.random.randint(k_step, (), 0, steps.shape[0])]
        z_data = S.joint_data(batch, self.streams)
        noise = S.normal(k_noise, z_data, self.streams, cast=True)
        if self.cfg.distill.backward_simulation:
            fixed = jax.lax.stop_gradient(params)
            frozen_v = self.denoiser(lambda: self.model(fixed, frozen), batch)
            x_k = self.rollout(frozen_v, noise, sig, k)
        else:
            s = sig[k]
            x_k = jax.tree.map(lambda d, n: ((1 - s) * d.astype(jnp.float32)
                                             + s * n.astype(jnp.float32)).astype(d.dtype),
                               z_data, noise)
        x_k = jax.lax.stop_gradient(x_k)
        b = batch["latents"].shape[0]
        s_k = jnp.full((b,), sig[k], jnp.float32)
        v, mask = self.denoiser(lambda: self.model(params, frozen), batch)(x_k, s_k)
        return self.clean(S.f32(x_k), S.f32(v), s_k, mask, S.f32(z_data)), x_k, k, mask

    def expert_steps(self, sig) -> tuple[int, ...]:
        """The student steps this run trains: all, or (two experts) those whose timestep is
        at / above (``high``) or below (``low``) the boundary."""
        d = self.cfg.distill
        n = d.steps
        if d.expert == "all":
            return tuple(range(n))
        sig = np.asarray(sig)
        high = tuple(k for k in range(n) if sig[k] * NUM_TRAIN_TIMESTEPS
                     >= d.boundary * NUM_TRAIN_TIMESTEPS)
        steps = high if d.expert == "high" else tuple(k for k in range(n) if k not in high)
        if not steps:
            raise ConfigError(f"distill.expert={d.expert}: none of the student's timesteps "
                              f"{[round(float(x) * 1000, 1) for x in sig[:-1]]} is "
                              f"{'at or above' if d.expert == 'high' else 'below'} "
                              f"distill.boundary={d.boundary:g} x 1000; change distill.sigmas "
                              f"or distill.shift")
        return steps

    def critic_range(self, shift: float) -> tuple[float, float]:
        """The critic's noise levels before the shift: ``[t_min, t_max]``, cut at the
        boundary for an expert (the boundary's unshifted level ``b / (s - (s-1)·b)``)."""
        d = self.cfg.distill
        if d.expert == "all":
            return d.t_min, d.t_max
        b = d.boundary / (shift - (shift - 1.0) * d.boundary)
        return (max(d.t_min, b), d.t_max) if d.expert == "high" else (d.t_min, min(d.t_max, b))

    def critic_sigma(self, key, b, latent_shape):
        shift = float(self.family.training_flow(tuple(latent_shape)).shift)
        lo, hi = self.critic_range(shift)
        u = jax.random.uniform(key, (b,), jnp.float32, lo, hi)
        return shift_sigma(u, shift)

    def generator_loss(self, params, fake, frozen, batch, null, key, sig, head=None):
        """The student's distribution-matching loss (plus, with ``head``, the GAN term) and
        its parts; with further streams the sum of each stream's
        (:func:`ditax.train.distill_streams.joint_dmd`), each stream's term and gradient
        scale among the parts (``dmd_loss_<stream>``, ``dmd_scale_<stream>``)."""
        k_sample, k_sigma, k_noise = jax.random.split(key, 3)
        x0, _, k, mask = self.student_sample(params, frozen, batch, k_sample, sig)
        x0_main = S.main(x0)
        b = x0_main.shape[0]
        sigma = self.critic_sigma(k_sigma, b, x0_main.shape[1:])
        eps = S.normal(k_noise, x0, self.streams)
        x_t = jax.lax.stop_gradient(S.mix(x0, eps, sigma))
        z_data = S.joint_data(batch, self.streams)
        real_v = self.guided(self.teacher(params, frozen), batch, null, self.cfg.distill.guidance)
        fake_fixed = jax.lax.stop_gradient(fake)
        x_in = S.cast_like(x_t, z_data)
        vr, _ = real_v(x_in, sigma)
        parts = {}
        if head is None:
            fake_v = self.denoiser(lambda: self.model(fake_fixed, frozen), batch)
            vf, _ = fake_v(x_in, sigma)
        else:   # one critic call: its features carry the gradient to x0, its score does not
            s = S.per_sample(sigma, x0)         # (no further streams: refused with a head)
            x_g = ((1 - s) * x0 + s * eps).astype(batch["latents"].dtype)
            vf, feats, _ = self.fake_features(fake_fixed, frozen, batch, x_g, sigma)
            vf = jax.lax.stop_gradient(vf)
            logits = self.discriminate(jax.lax.stop_gradient(head), feats)
            parts["gan_generator"] = jnp.mean(jax.nn.softplus(-logits))
        data = S.f32(z_data)
        real = jax.lax.stop_gradient(self.clean(x_t, S.f32(vr), sigma, mask, data))
        fake_x0 = jax.lax.stop_gradient(self.clean(x_t, S.f32(vf), sigma, mask, data))
        loss, per = S.joint_dmd(x0, real, fake_x0, mask)
        parts.update(student_step=k, dmd_scale=jnp.mean(jnp.abs(per[S.MAIN][1])), dmd_loss=loss)
        if self.streams:
            for name, (term, grad) in per.items():
                parts[f"dmd_loss_{name}"] = term
                parts[f"dmd_scale_{name}"] = jnp.mean(jnp.abs(grad))
        if head is not None:
            loss = loss + self.cfg.distill.gan_weight * parts["gan_generator"]
        return loss, parts

    def critic_loss(self, fake, params, frozen, batch, key, sig, head=None):
        """The critic's flow-matching loss on a student sample (no gradient to the student),
        on every stream (:func:`~ditax.train.loss.joint_flow_loss`: the student's ``x̂0`` of
        each stream its clean latents); with ``head`` (``fake`` then a pair ``(critic,
        head)``), plus the GAN term's classification of the student's noised sample against
        the noised data."""
        if head is not None:
            fake, head = fake
        k_sample, k_flow, k_gan = jax.random.split(key, 3)
        x0, _, _, _ = self.student_sample(jax.lax.stop_gradient(params), frozen, batch,
                                          k_sample, sig)
        x0 = S.cast_like(jax.lax.stop_gradient(x0), S.joint_data(batch, self.streams))
        gan = 0.0
        if head is not None:
            k_sigma, k_noise = jax.random.split(k_gan)
            b = x0.shape[0]
            sigma = self.critic_sigma(k_sigma, b, x0.shape[1:])
            s = sigma.reshape((-1,) + (1,) * (x0.ndim - 1))
            eps = jax.random.normal(k_noise, x0.shape, jnp.float32)
            data = batch["latents"].astype(jnp.float32)
            both = jnp.concatenate([(1 - s) * x0 + s * eps, (1 - s) * data + s * eps])
            pair = {k: jnp.concatenate([v, v]) for k, v in batch.items()}
            _, feats, _ = self.fake_features(fake, frozen, pair, both.astype(x0.dtype),
                                             jnp.concatenate([sigma, sigma]))
            logits = self.discriminate(head, feats)
            gan = self.cfg.distill.gan_critic_weight * (
                jnp.mean(jax.nn.softplus(logits[:b])) + jnp.mean(jax.nn.softplus(-logits[b:])))
        model = self.model(fake, frozen)
        condition = {k: batch[k] for k in self.condition_keys} or None

        def inputs(x_t, x0_, t):
            return self.family.training_inputs(x_t, x0_, t, condition)

        x0_main = S.main(x0)
        flow = self.family.training_flow(tuple(x0_main.shape[1:]))
        text, mask = batch["text"], batch["text_mask"].astype(bool)
        if not self.streams:
            def apply(x, t, text, mask):
                return self.family.apply(model, x, t, text, mask, condition)

            return flow_loss(apply, x0, text, mask, k_flow, flow, inputs) + gan

        def joint_apply(x, t, text, mask, noisy):
            return self.family.apply(model, x, t, text, mask, {**condition, **noisy})

        loss, _ = joint_flow_loss(joint_apply, x0_main, {n: x0[n] for n in self.streams}, text,
                                  mask, k_flow, flow, inputs)
        return loss + gan

    def schedule_table(self, latent_shape):
        """The student's sigma table ``[K+1]`` (host numpy, float32;
        :func:`~ditax.train.distill_schedule.student_schedule`, stretched to the sampler's
        terminal sigma where it has one)."""
        _, sig = student_schedule(distill_sigmas(self.cfg.distill),
                                  student_shift(self.cfg, self.family, latent_shape),
                                  self.terminal)
        return np.asarray(sig, np.float32)

    def _step_fn(self, state, batch, null):
        key = jax.random.fold_in(jax.random.wrap_key_data(state["key"]), state["step"])
        sig = jnp.asarray(self.schedule_table(batch["latents"].shape[1:]))
        frozen = state["frozen"]
        d = self.cfg.distill

        gan = self.gan

        def critic_update(i, carry):
            fake, fake_opt, total, _ = carry
            k = jax.random.fold_in(jax.random.fold_in(key, _TAG_CRITIC), i)
            head = fake[1] if gan else None     # with the GAN term: (critic, head) train
            loss, grads = jax.value_and_grad(self.critic_loss)(fake, state["params"], frozen,
                                                               batch, k, sig, head)
            updates, fake_opt = self.critic_tx.update(grads, fake_opt, fake)
            return (optax.apply_updates(fake, updates), fake_opt,
                    total + loss.astype(jnp.float32),
                    optax.tree.norm(grads).astype(jnp.float32))   # bf16 weights: f32 carry

        zero = jnp.zeros((), jnp.float32)
        trained = (state["fake"], state["head"]) if gan else state["fake"]
        trained, fake_opt, critic_total, critic_norm = jax.lax.fori_loop(
            0, d.critic_updates, critic_update, (trained, state["fake_opt"], zero, zero))
        fake, head = trained if gan else (trained, None)
        (loss, parts), grads = jax.value_and_grad(self.generator_loss, has_aux=True)(
            state["params"], fake, frozen, batch, null, jax.random.fold_in(key, _TAG_STUDENT),
            sig, head)
        updates, opt = self.tx.update(grads, state["opt"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads),
                   "lr": jnp.asarray(self.schedule(state["step"]), jnp.float32),
                   "critic_loss": critic_total / d.critic_updates,
                   "critic_grad_norm": critic_norm, **parts}
        new = {"params": params, "opt": opt, "fake": fake, "fake_opt": fake_opt,
               "frozen": frozen, "step": state["step"] + 1, "key": state["key"]}
        if gan:
            new["head"] = head
        return new, metrics

    def step(self, state: dict, batch: dict):
        """One student update after its critic updates; ``state`` is donated."""
        if self.null is None:
            raise RuntimeError("bind_data(data) first: it reads the empty prompt's embedding")
        return self._step(state, batch, self.null)

    def preview(self, state: dict, batch: dict, n: int = 4) -> np.ndarray:
        """The student's K-step samples of the batch's first ``n`` prompts from fixed noise
        (the run's seed) as one ``[H, W, 3]`` uint8 strip of latent previews: the first three
        latent channels of the middle frame, each stretched to its range over the strip,
        nearest-upscaled to at least 64 pixels."""
        if getattr(self, "_preview", None) is None:
            def run(params, frozen, batch):
                noise = S.normal(jax.random.PRNGKey(self.cfg.seed),
                                 S.joint_data(batch, self.streams), self.streams, cast=True)
                sig = jnp.asarray(self.schedule_table(batch["latents"].shape[1:]))
                v = self.denoiser(lambda: self.model(params, frozen), batch)
                return S.main(self.rollout(v, noise, sig, self.cfg.distill.steps))
            self._preview = jax.jit(run)
        lat = np.asarray(self._preview(state["params"], state["frozen"], batch), np.float32)
        lat = lat[:n, :3, lat.shape[2] // 2]                      # [n, 3, Y, X]
        lo = lat.min(axis=(0, 2, 3), keepdims=True)
        hi = lat.max(axis=(0, 2, 3), keepdims=True)
        img = ((lat - lo) / np.maximum(hi - lo, 1e-6) * 255).round().astype(np.uint8)
        img = np.concatenate(list(img.transpose(0, 2, 3, 1)), axis=1)   # [Y, n*X, 3]
        up = max(1, -(-64 // img.shape[0]))
        return np.repeat(np.repeat(img, up, axis=0), up, axis=1)

    def lower(self, batch_abstract: dict, null_abstract: dict | None = None):
        """``jit(...).lower`` on abstract state and batch (no allocation)."""
        if null_abstract is None:
            null_abstract = self.null
        return self._step.lower(self.abstract_state(), batch_abstract, null_abstract)


def make_trainer(cfg: Config, mesh):
    """The trainer a config asks for: :class:`DistillTrainer` for ``distill.method=dmd2``,
    else :class:`~ditax.train.step.Trainer`."""
    if cfg.distill.method == "dmd2":
        return DistillTrainer(cfg, mesh)
    from ditax.train.step import Trainer

    return Trainer(cfg, mesh)


__all__ = ["DistillTrainer", "make_trainer", "student_schedule", "student_shift",
           "sample_settings", "dmd_gradient", "dmd_loss"]
