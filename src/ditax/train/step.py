"""Optimiser, sharded train state and the jitted train step.

The train state is a plain pytree ``{"params", "opt", "step", "key"}``: ``params`` is the
model's parameter tree as nested dicts (``nnx.to_pure_dict``), ``opt`` the optax state,
``step`` the number of completed steps (int32) and ``key`` the run's base PRNG key data
(uint32 [2]). Each step draws its noise from ``fold_in(key, step)``, so the random stream is a
function of the step number only — resuming reproduces it bit for bit.

The model comes from its family (:func:`ditax.models.base.model_family`): the module, the
parameter shardings and the denoiser call of the loss; nothing here knows which model it is.

Shardings: parameters as the family says (Wan: the logical rules); every optimiser leaf that
mirrors a parameter takes that parameter's sharding (found by its key path); scalars are
replicated. The batch is sharded over the batch axes of the mesh. One ``jax.jit`` with
explicit in/out shardings and the state donated, so every mesh runs the same program up to
layout. The jitted step belongs to its :class:`Trainer`: reuse the Trainer to reuse the
compiled step (e.g. ``train(cfg, trainer=tr)`` for runs that differ only in data or output).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from ditax.config import Config, ConfigError, OptimConfig
from ditax.config.schema import check_offload
from ditax.models.base import model_family
from ditax.models.common.fields import for_training
from ditax.parallel.axes import batch_entry
from ditax.pipelines.sparse_steps import dense_graph
from ditax.train.adapters import AdapterSplit, ParamSplit
from ditax.train.loss import joint_flow_loss


def learning_rate_schedule(o: OptimConfig, total_steps: int) -> optax.Schedule:
    """Linear warmup to ``learning_rate`` over ``warmup_steps``, then constant / cosine / linear.

    Decay runs until ``optim.decay_steps`` (0 = the run's ``steps``); set it explicitly when a
    run will be extended by resuming with a larger ``steps``, so the schedule does not change.
    """
    lr = o.learning_rate
    decay_total = o.decay_steps or total_steps
    decay = max(1, decay_total - o.warmup_steps)
    if o.schedule == "constant":
        main = optax.constant_schedule(lr)
    elif o.schedule == "cosine":
        main = optax.cosine_decay_schedule(lr, decay, alpha=0.0)
    elif o.schedule == "linear":
        main = optax.linear_schedule(lr, 0.0, decay)
    else:
        raise ValueError(f"optim.schedule={o.schedule!r}: use constant, cosine or linear")
    if o.warmup_steps == 0:
        return main
    warm = optax.linear_schedule(lr / o.warmup_steps, lr, o.warmup_steps - 1) \
        if o.warmup_steps > 1 else optax.constant_schedule(lr)
    return optax.join_schedules([warm, main], [o.warmup_steps])


def make_optimizer(o: OptimConfig, total_steps: int, rate=None):
    """``clip_by_global_norm → AdamW(schedule)``; returns (optimizer, schedule).

    ``rate``: the learning rate as a function of the update count, in place of ``o``'s
    schedule (e.g. ``lambda count: lr`` with ``lr`` an argument of a compiled step, so that one
    program serves every schedule); the optimizer state is the same either way."""
    sched = learning_rate_schedule(o, total_steps)
    tx = optax.chain(
        optax.clip_by_global_norm(o.grad_clip) if o.grad_clip > 0 else optax.identity(),
        optax.adamw(sched if rate is None else rate, b1=o.b1, b2=o.b2, eps=o.eps,
                    weight_decay=o.weight_decay),
    )
    return tx, sched


def _keys(path) -> tuple[str, ...]:
    return tuple(str(getattr(p, "key", getattr(p, "name", getattr(p, "idx", p)))) for p in path)


def opt_shardings(opt_abstract, params_sh: dict, mesh) -> Any:
    """Shardings for an optax state: a leaf whose key path ends with a parameter's path takes
    that parameter's sharding; everything else (counts, scalars) is replicated."""
    by_path = {_keys(p): s for p, s in jax.tree_util.tree_flatten_with_path(params_sh)[0]}
    longest = max(len(k) for k in by_path)

    def one(path, leaf):
        k = _keys(path)
        for n in range(min(longest, len(k)), 0, -1):
            s = by_path.get(k[-n:])
            if s is not None and len(s.spec) <= len(leaf.shape):
                return s
        return NamedSharding(mesh, P())

    return jax.tree_util.tree_map_with_path(one, opt_abstract)


def batch_shardings(mesh, condition_keys=()) -> dict[str, NamedSharding]:
    """Batch dim over the batch shards; everything else replicated at the input.
    ``condition_keys``: the model family's image-condition entries (image-to-video)."""
    b = batch_entry(mesh)
    return {k: NamedSharding(mesh, P(b))
            for k in ("latents", "text", "text_mask", *condition_keys)}


def program_fields(cfg: Config) -> dict:
    """The parts of ``cfg`` that decide a Trainer's programs (model, attention, optimiser and
    schedule, objective, init seed); a Trainer serves any config that agrees on them."""
    o = cfg.optim
    steps = cfg.steps if (o.schedule != "constant" and not o.decay_steps) else None
    return {"model": cfg.model, "attention": cfg.attention, "optim": o, "flow": cfg.flow,
            "seed": cfg.seed, "steps (sets the decay schedule)": steps, "lora": cfg.lora,
            "train": cfg.train,     # the previews' interval is not part of the program
            "distill": dataclasses.replace(cfg.distill, sample_every=0)}


class TrainerBase:
    """What every trainer shares (:class:`Trainer`, :class:`~ditax.train.distill.DistillTrainer`):
    the config check, the model bound to its weights, the seed's weights and the batch put on
    the mesh. A subclass sets ``cfg``, ``mesh``, ``family``, ``split`` (None: every weight
    trains; then ``graphdef`` and ``_abs_state``) and ``batch_sh``."""

    def check_serves(self, cfg: Config) -> None:
        """:class:`ConfigError` unless this Trainer runs the program ``cfg`` asks for."""
        mine, theirs = program_fields(self.cfg), program_fields(cfg)
        diff = [k for k in mine if mine[k] != theirs[k]]
        if diff:
            raise ConfigError(f"the given Trainer was built for a config that differs in "
                              f"{', '.join(diff)}; build a trainer for this config "
                              f"(make_trainer(cfg, mesh))")

    def _random_params(self) -> dict:
        model = self.family.create(self.mesh, nnx.Rngs(self.cfg.seed))
        return nnx.to_pure_dict(nnx.split(model)[1])

    def model(self, params: dict, frozen: dict | None = None, graphdef=None):
        """An NNX module bound to ``params`` (and, with a split, the ``frozen`` weights);
        ``graphdef``: another graph over the same parameters (a sparse model's dense twin,
        :func:`ditax.pipelines.sparse_steps.dense_graph`) in place of the model's."""
        if self.split is not None:
            return self.split.model(params, frozen, graphdef)
        st = jax.tree.map(lambda x: x, self._abs_state)
        nnx.replace_by_pure_dict(st, params)
        return nnx.merge(self.graphdef if graphdef is None else graphdef, st)

    def dense_twin_graph(self):
        """The dense twin of the model's graph (:func:`~ditax.pipelines.sparse_steps.
        dense_graph`: its weights and paths, attention dense); None when it has no sparsity."""
        if self.split is None:
            return dense_graph(self.graphdef, self._abs_state)
        return dense_graph(self.split.graphdef, *self.split._abs)

    def frozen_params(self, params: dict, frozen: dict) -> dict:
        """The trained parameters of the run's frozen model (the DMD2 teacher, the flow's
        dense teacher), run with ``frozen`` as :meth:`model` takes them: with a LoRA split the
        adapters (``params``' shape) zeroed over the base; else the frozen copy ``frozen`` of
        the initial weights."""
        return jax.tree.map(jnp.zeros_like, params) if self.split is not None else frozen

    def frozen_model(self, params: dict, frozen: dict, graphdef=None):
        """The module of the run's frozen weights (:meth:`frozen_params`) under ``graphdef``
        as :meth:`model`."""
        return self.model(self.frozen_params(params, frozen), frozen, graphdef)

    def put_batch(self, local: dict) -> dict:
        """Per-process numpy batch → global arrays sharded over the batch axes."""
        out = {}
        n_proc = jax.process_count()
        for k, v in local.items():
            gshape = (v.shape[0] * n_proc,) + v.shape[1:]
            out[k] = jax.make_array_from_process_local_data(self.batch_sh[k], v, gshape)
        return out


#: ``fold_in`` of the step key that draws which samples are first-frame conditioned
FIRST_FRAME_DRAW = 0x1F1F


class Trainer(TrainerBase):
    """Holds the graph, optimiser, shardings and the jitted step; builds / inits / steps the
    train state.

    ``Trainer(cfg, mesh)``; ``state = trainer.init()``; ``state, metrics = trainer.step(state,
    batch)`` where batch is a dict of global ``jax.Array`` (see :meth:`put_batch`). The step is
    compiled on first use and kept by this object, so one Trainer runs many steps (and many
    :func:`~ditax.train.loop.train` calls) without compiling again.
    """

    def __init__(self, cfg: Config, mesh):
        self.cfg = cfg
        self.mesh = mesh
        check_offload(cfg)
        # offloaded weights: each block copied in its own step (a carried prefetch would be
        # kept for the backward pass)
        self.family = model_family(for_training(cfg.model), cfg.attention, cfg.flow)
        self.family.check_flow()
        self.family.check_first_frame(cfg.train.first_frame_p)
        # a split: params = what trains (LoRA: the adapters; a family's choice: e.g. a VACE
        # model's VACE branch), the rest frozen; ``adapters``: the LoRA one (saved as files)
        self.adapters = self.split = None
        trained = self.family.trained_params(cfg.train)
        if cfg.lora.rank > 0 and trained is not None:
            raise ConfigError(f"lora.rank={cfg.lora.rank} trains adapters on the base blocks, "
                              f"but train.vace_trainable={cfg.train.vace_trainable!r} trains "
                              f"the VACE branch; set train.vace_trainable=all with LoRA, or "
                              f"lora.rank=0")
        if cfg.lora.rank > 0:
            self.split = self.adapters = AdapterSplit(self.family, cfg, mesh)
        elif trained is not None:
            self.split = ParamSplit(self.family, cfg, mesh,
                                    lambda seed: self.family.create(mesh, nnx.Rngs(seed)),
                                    trained)
        if self.split is not None:
            self.params_abstract = self.split.train_abstract
            self.params_sh = self.split.train_sh
        else:
            self.graphdef, abs_state = nnx.split(self.family.abstract(mesh))
            self._abs_state = abs_state
            self.params_abstract = nnx.to_pure_dict(abs_state)
            self.params_sh = self.family.param_shardings(self.params_abstract, mesh)
        self.teacher_graph = self._teacher_graph()
        self.tx, self.schedule = make_optimizer(cfg.optim, cfg.steps)
        opt_abs = jax.eval_shape(self.tx.init, self.params_abstract)
        rep = NamedSharding(mesh, P())
        self.state_sh = {"params": self.params_sh,
                         "opt": opt_shardings(opt_abs, self.params_sh, mesh),
                         "step": rep, "key": rep}
        # the frozen weights: a split's base; a full run's dense teacher (its initial weights)
        self.frozen_abstract = None
        if self.split is not None:
            self.frozen_abstract, self.state_sh["frozen"] = (self.split.frozen_abstract,
                                                             self.split.frozen_sh)
        elif self.teacher_graph is not None:
            self.frozen_abstract, self.state_sh["frozen"] = self.params_abstract, self.params_sh
        # state keys a checkpoint leaves out: the frozen weights, rebuilt on resume by init()
        # from the base (init_from or the seed) and checked (ditax.train.frozen_base)
        self.rebuilt = ("frozen",) if self.frozen_abstract is not None else ()
        # names only (the shapes follow the data): a one-pixel latent asks which entries exist
        self.condition_keys = tuple(self.family.condition_shapes(
            (self.family.latent_channels, 1, 1, 1)))
        self.batch_sh = batch_shardings(mesh, self.condition_keys)
        self._step = jax.jit(self._step_fn, in_shardings=(self.state_sh, self.batch_sh),
                             out_shardings=(self.state_sh, rep), donate_argnums=(0,))
        self._init_params = jax.jit(self._random_params, out_shardings=self.params_sh)
        self._copy = jax.jit(lambda t: jax.tree.map(jnp.copy, t), out_shardings=self.params_sh)

    def _teacher_graph(self):
        """``flow.target=dense_teacher``: the graph the teacher runs, the dense twin of the
        model's (:func:`~ditax.pipelines.sparse_steps.dense_graph`; a full run on a frozen
        copy of its initial weights, a LoRA run on its base); None for ``flow.target=data``.
        :class:`ConfigError` where there is no teacher to build."""
        cfg = self.cfg
        if cfg.flow.target != "dense_teacher":
            return None
        if self.split is not None and self.adapters is None:
            raise ConfigError(f"flow.target=dense_teacher needs the whole model's initial "
                              f"weights, but train.vace_trainable={cfg.train.vace_trainable!r} "
                              f"trains a part of it; set train.vace_trainable=all or "
                              f"flow.target=data")
        graph = self.dense_twin_graph()
        if graph is None:
            raise ConfigError(f"flow.target=dense_teacher: model family {self.family.name!r} "
                              f"builds no sparse attention from attention.sparsity="
                              f"{cfg.attention.sparsity} (nothing to match); set "
                              f"flow.target=data")
        return graph

    @property
    def flops_factor(self) -> float:
        """Model FLOPs of a step in forward + backward passes (3 forwards) of the model: one
        more forward with a dense teacher (counted at the model's cost)."""
        return 1.0 if self.teacher_graph is None else 4.0 / 3.0

    # -- state -------------------------------------------------------------------------------

    def abstract_state(self) -> dict:
        """``ShapeDtypeStruct`` tree of the state with shardings (a restore target)."""
        def sds(x, s):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)

        opt_abs = jax.eval_shape(self.tx.init, self.params_abstract)
        out = {"params": jax.tree.map(sds, self.params_abstract, self.params_sh),
               "opt": jax.tree.map(sds, opt_abs, self.state_sh["opt"]),
               "step": jax.ShapeDtypeStruct((), jnp.int32, sharding=self.state_sh["step"]),
               "key": jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=self.state_sh["key"])}
        if self.frozen_abstract is not None:
            out["frozen"] = jax.tree.map(sds, self.frozen_abstract, self.state_sh["frozen"])
        return out

    def init(self, params: dict | None = None) -> dict:
        """Fresh state from ``cfg.seed`` (or from given parameters, e.g. ``init_from``; with
        a split their frozen part is frozen, LoRA's adapters start fresh; a full run's dense
        teacher is a copy of them)."""
        frozen = None
        if self.split is not None:
            params, frozen = self.split.init(params)
        elif params is None:
            params = self._init_params()
        else:
            params = jax.device_put(params, self.params_sh)
        if self.split is None and self.frozen_abstract is not None:
            frozen = self._copy(params)
        opt = jax.jit(self.tx.init, out_shardings=self.state_sh["opt"])(params)
        key = jax.random.key_data(jax.random.PRNGKey(self.cfg.seed ^ 0x5EED)).astype(jnp.uint32)
        rep = self.state_sh["step"]
        state = {"params": params, "opt": opt,
                 "step": jax.device_put(jnp.zeros((), jnp.int32), rep),
                 "key": jax.device_put(key, rep)}
        if frozen is not None:
            state["frozen"] = frozen
        return state

    # -- step --------------------------------------------------------------------------------

    def loss_fn(self, params, batch, key, frozen=None):
        """``(loss, parts)``: the flow loss of ``batch`` (towards the data's velocity, or with
        ``flow.target=dense_teacher`` the frozen initial weights' prediction under the dense
        twin of the graph: :meth:`frozen_model`) and, for a family that denoises
        further streams (:meth:`~ditax.models.base.ModelFamily.noised_entries`), each
        stream's own term (:func:`~ditax.train.loss.joint_flow_loss`; empty otherwise)."""
        condition = {k: batch[k] for k in self.condition_keys} or None
        streams = {k: batch[k] for k in self.family.noised_entries()}

        def denoiser(model):
            return lambda x, t, text, mask, noisy: self.family.apply(
                model, x, t, text, mask, {**condition, **noisy} if condition else None)

        apply = denoiser(self.model(params, frozen))
        teacher = (None if self.teacher_graph is None else
                   denoiser(self.frozen_model(params, frozen, self.teacher_graph)))

        def inputs(x_t, x0, t):
            x_t, t, mask = self.family.training_inputs(x_t, x0, t, condition)
            p = self.cfg.train.first_frame_p
            if p:   # its own draw: the sigma and noise draws stay those of p = 0
                k = jax.random.fold_in(key, FIRST_FRAME_DRAW)
                x_t, t, mask = self.family.first_frame_inputs(x_t, x0, t, mask, k, p)
            return x_t, t, mask

        flow = self.family.training_flow(tuple(batch["latents"].shape[1:]))
        return joint_flow_loss(apply, batch["latents"], streams, batch["text"],
                               batch["text_mask"].astype(bool), key, flow, inputs, teacher)

    def _step_fn(self, state, batch):
        key = jax.random.fold_in(jax.random.wrap_key_data(state["key"]), state["step"])
        frozen = state.get("frozen")   # a split: no gradient for the frozen weights
        (loss, parts), grads = jax.value_and_grad(self.loss_fn, has_aux=True)(
            state["params"], batch, key, frozen)
        grad_norm = optax.tree.norm(grads)
        updates, opt = self.tx.update(grads, state["opt"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        metrics = {"loss": loss, "grad_norm": grad_norm,
                   "lr": jnp.asarray(self.schedule(state["step"]), jnp.float32),
                   **{f"loss_{k}": v for k, v in parts.items()}}   # a stream's own term
        new = {"params": params, "opt": opt, "step": state["step"] + 1, "key": state["key"]}
        if frozen is not None:
            new["frozen"] = frozen
        return new, metrics

    def step(self, state: dict, batch: dict):
        """One optimiser step; ``state`` is donated (do not reuse it)."""
        return self._step(state, batch)

    def lower(self, batch_abstract: dict):
        """``jit(...).lower`` on abstract state and batch (no allocation), for memory analysis."""
        return self._step.lower(self.abstract_state(), batch_abstract)
