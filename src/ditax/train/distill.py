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

A sparse student (``attention.sparsity``, e.g. ``vsa``): only the student runs it (VSA: its
gates train with it); the real and the fake score run the dense twin of the student's graph
(:func:`~ditax.pipelines.sparse_steps.dense_graph`: same weights, attention dense, a gate
unread), so the teacher is the dense model it was and the critic learns dense.

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
head: :mod:`ditax.train.distill_gan`; the step's pieces and losses:
:mod:`ditax.train.distill_losses`; its model FLOPs: :mod:`ditax.train.distill_cost`.
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
from ditax.models.base import model_family
from ditax.train import distill_streams as S
from ditax.train.adapters import AdapterSplit
from ditax.train.distill_cost import DistillCost
from ditax.train.distill_gan import GanHead
from ditax.train.distill_losses import DmdLosses
from ditax.train.distill_schedule import (sample_settings, sampling_terminal, student_schedule,
                                          student_shift)
from ditax.train.distill_streams import dmd_gradient, dmd_loss
from ditax.train.step import TrainerBase, batch_shardings, make_optimizer, opt_shardings

_TAG_CRITIC, _TAG_STUDENT = 1, 2


def _copy_tree(tree):
    return jax.tree.map(jnp.copy, tree)


class DistillTrainer(DmdLosses, GanHead, DistillCost, TrainerBase):
    """The :class:`~ditax.train.step.Trainer` of a distillation run: same interface
    (``init``, ``step``, ``put_batch``, ``abstract_state``, ``adapters``), a state with the
    critic (``fake``, ``fake_opt``) beside the student (``params``, ``opt``) and the frozen
    teacher or base (``frozen``)."""

    method = "dmd2"     # the distill.method this trainer runs

    def __init__(self, cfg: Config, mesh):
        if cfg.distill.method != self.method:
            raise ConfigError(f"distill.method={cfg.distill.method!r}: {type(self).__name__} "
                              f"runs distill.method={self.method}")
        self.cfg = cfg
        self.mesh = mesh
        self.family = model_family(cfg.model, cfg.attention, cfg.flow)
        self.family.check_flow()
        if cfg.attention.sparsity != "none" and cfg.attention.dense_steps:
            raise ConfigError(f"attention.dense_steps={cfg.attention.dense_steps}: a sparse "
                              f"student trains every step sparse (attention.sparsity="
                              f"{cfg.attention.sparsity}); set attention.dense_steps=0")
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
        # a sparse student: the scores run its graph's dense twin (same weights; None: dense)
        self.score_graph = self.dense_twin_graph()
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
        """A thunk building the real score's module (the frozen teacher; with LoRA the base,
        adapters zeroed) through :meth:`score_model`, which a subclass may override (a causal
        student's teacher runs bidirectionally: :mod:`ditax.train.self_forcing`)."""
        params = self.frozen_params(state_params, frozen)
        return lambda: self.score_model(params, frozen)

    def score_model(self, params: dict, frozen: dict):
        """The module of a score (the real one, the critic) on ``params``: here the student's
        own architecture (:meth:`model`; a causal student's scores are bidirectional) with
        dense attention (a sparse student's scores: its graph's dense twin)."""
        return self.model(params, frozen, self.score_graph)

    def student_video(self, params, frozen, batch, noise, sig):
        """The student's whole K-step sample (joint latents) from ``noise`` (the previews')."""
        v = self.denoiser(lambda: self.model(params, frozen), batch)
        return self.rollout(v, noise, sig, self.cfg.distill.steps)

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

    # -- the step (its pieces: ditax.train.distill_losses) ----------------------------------

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
                return S.main(self.student_video(params, frozen, batch, noise, sig))
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


__all__ = ["DistillTrainer", "student_schedule", "student_shift",
           "sample_settings", "dmd_gradient", "dmd_loss"]
