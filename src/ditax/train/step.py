"""Optimiser, sharded train state and the jitted train step.

The train state is a plain pytree ``{"params", "opt", "step", "key"}``: ``params`` is the
model's parameter tree as nested dicts (``nnx.to_pure_dict``), ``opt`` the optax state,
``step`` the number of completed steps (int32) and ``key`` the run's base PRNG key data
(uint32 [2]). Each step draws its noise from ``fold_in(key, step)``, so the random stream is a
function of the step number only — resuming reproduces it bit for bit.

Shardings: parameters by the logical rules (:func:`ditax.models.wan.loading.param_shardings`);
every optimiser leaf that mirrors a parameter takes that parameter's sharding (found by its
key path); scalars are replicated. The batch is sharded over ``(data, fsdp)``; inside the
model the token sequence is sharded over ``context``. One ``jax.jit`` with explicit in/out
shardings and the state donated, so every mesh runs the same program up to layout.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from ditax.config import Config, OptimConfig
from ditax.models.wan.loading import abstract_model, param_shardings
from ditax.parallel.axes import batch_entry
from ditax.train.loss import flow_loss


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


def make_optimizer(o: OptimConfig, total_steps: int):
    """``clip_by_global_norm → AdamW(schedule)``; returns (optimizer, schedule)."""
    sched = learning_rate_schedule(o, total_steps)
    tx = optax.chain(
        optax.clip_by_global_norm(o.grad_clip) if o.grad_clip > 0 else optax.identity(),
        optax.adamw(sched, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay),
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


def batch_shardings(mesh) -> dict[str, NamedSharding]:
    """Batch dim over the batch shards; everything else replicated at the input."""
    b = batch_entry(mesh)
    return {"latents": NamedSharding(mesh, P(b)), "text": NamedSharding(mesh, P(b)),
            "text_mask": NamedSharding(mesh, P(b))}


_STEP_CACHE: dict = {}


class Trainer:
    """Holds the graph, optimiser and shardings; builds / inits / steps the train state.

    ``Trainer(cfg, mesh)``; ``state = trainer.init()``; ``state, metrics = trainer.step(state,
    batch)`` where batch is a dict of global ``jax.Array`` (see :meth:`put_batch`).
    """

    def __init__(self, cfg: Config, mesh, compiler_options: dict | None = None):
        self.cfg = cfg
        self.mesh = mesh
        # e.g. {"xla_backend_optimization_level": 0}: tests use it to compile ~3x faster on CPU
        self.compiler_options = compiler_options
        model_abs = abstract_model(cfg.model, cfg.attention, mesh)
        self.graphdef, abs_state = nnx.split(model_abs)
        self._abs_state = abs_state
        self.params_abstract = nnx.to_pure_dict(abs_state)
        self.params_sh = param_shardings(self.params_abstract, cfg.model, mesh)
        self.tx, self.schedule = make_optimizer(cfg.optim, cfg.steps)
        opt_abs = jax.eval_shape(self.tx.init, self.params_abstract)
        rep = NamedSharding(mesh, P())
        self.state_sh = {"params": self.params_sh,
                         "opt": opt_shardings(opt_abs, self.params_sh, mesh),
                         "step": rep, "key": rep}
        self.batch_sh = batch_shardings(mesh)
        # Trainers with the same program share one jitted step (and so its compile cache):
        # a resumed run in the same process, or tests, do not recompile.
        key = self._program_key()
        if key not in _STEP_CACHE:
            _STEP_CACHE[key] = jax.jit(
                self._step_fn, in_shardings=(self.state_sh, self.batch_sh),
                out_shardings=(self.state_sh, rep), donate_argnums=(0,),
                compiler_options=compiler_options)
        self._step = _STEP_CACHE[key]

    def _program_key(self):
        c = self.cfg
        o = c.optim
        steps = c.steps if (o.schedule != "constant" and not o.decay_steps) else None
        opts = tuple(sorted((self.compiler_options or {}).items()))
        return (c.model, c.attention, o, c.flow, steps, self.mesh, opts)

    # -- state -------------------------------------------------------------------------------

    def abstract_state(self) -> dict:
        """``ShapeDtypeStruct`` tree of the state with shardings (a restore target)."""
        def sds(x, s):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)

        opt_abs = jax.eval_shape(self.tx.init, self.params_abstract)
        return {"params": jax.tree.map(sds, self.params_abstract, self.params_sh),
                "opt": jax.tree.map(sds, opt_abs, self.state_sh["opt"]),
                "step": jax.ShapeDtypeStruct((), jnp.int32, sharding=self.state_sh["step"]),
                "key": jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=self.state_sh["key"])}

    def init(self, params: dict | None = None) -> dict:
        """Fresh state from ``cfg.seed`` (or from given parameters, e.g. ``init_from``)."""
        cfg = self.cfg
        if params is None:
            from ditax.models.wan.transformer import WanTransformer

            ikey = ("init", cfg.model, cfg.attention, cfg.seed, self.mesh,
                    tuple(sorted((self.compiler_options or {}).items())))
            if ikey not in _STEP_CACHE:
                def make():
                    m = WanTransformer(cfg.model, cfg.attention, self.mesh,
                                       rngs=nnx.Rngs(cfg.seed))
                    return nnx.to_pure_dict(nnx.split(m)[1])

                _STEP_CACHE[ikey] = jax.jit(make, out_shardings=self.params_sh,
                                            compiler_options=self.compiler_options)
            params = _STEP_CACHE[ikey]()
        else:
            params = jax.device_put(params, self.params_sh)
        opt = jax.jit(self.tx.init, out_shardings=self.state_sh["opt"])(params)
        key = jax.random.key_data(jax.random.PRNGKey(cfg.seed ^ 0x5EED)).astype(jnp.uint32)
        rep = self.state_sh["step"]
        return {"params": params, "opt": opt,
                "step": jax.device_put(jnp.zeros((), jnp.int32), rep),
                "key": jax.device_put(key, rep)}

    def model(self, params: dict):
        """An NNX module bound to ``params`` (for evaluation / sampling)."""
        st = jax.tree.map(lambda x: x, self._abs_state)
        nnx.replace_by_pure_dict(st, params)
        return nnx.merge(self.graphdef, st)

    # -- step --------------------------------------------------------------------------------

    def put_batch(self, local: dict) -> dict:
        """Per-process numpy batch → global arrays sharded over (data, fsdp)."""
        out = {}
        n_proc = jax.process_count()
        for k, v in local.items():
            gshape = (v.shape[0] * n_proc,) + v.shape[1:]
            out[k] = jax.make_array_from_process_local_data(self.batch_sh[k], v, gshape)
        return out

    def loss_fn(self, params, batch, key):
        model = self.model(params)

        def apply(x, t, text, mask):
            return model(x, t, text, mask)

        return flow_loss(apply, batch["latents"], batch["text"],
                         batch["text_mask"].astype(bool), key, self.cfg.flow)

    def _step_fn(self, state, batch):
        key = jax.random.fold_in(jax.random.wrap_key_data(state["key"]), state["step"])
        loss, grads = jax.value_and_grad(self.loss_fn)(state["params"], batch, key)
        grad_norm = optax.tree.norm(grads)
        updates, opt = self.tx.update(grads, state["opt"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        metrics = {"loss": loss, "grad_norm": grad_norm,
                   "lr": jnp.asarray(self.schedule(state["step"]), jnp.float32)}
        return ({"params": params, "opt": opt, "step": state["step"] + 1, "key": state["key"]},
                metrics)

    def step(self, state: dict, batch: dict):
        """One optimiser step; ``state`` is donated (do not reuse it)."""
        return self._step(state, batch)

    def lower(self, batch_abstract: dict):
        """``jit(...).lower`` on abstract state and batch (no allocation), for memory analysis."""
        return self._step.lower(self.abstract_state(), batch_abstract)


def train_flops_per_sample(cfg: Config, latent_shape, text_len: int) -> float:
    """Model FLOPs of one training sample (forward + backward = 3 × forward matmul FLOPs).

    Per block, with L video tokens, T text tokens, width D, MLP width M:
    self-attention 8·L·D² (q, k, v, o) + 4·L²·D (scores and values); cross-attention
    4·L·D² + 4·T·D² + 4·L·T·D; MLP 4·L·D·M. Plus the patch embedding, text embedder
    (2·T·Dt·D + 2·T·D²) and output projection. Remat recomputation is not counted (MFU
    convention: useful FLOPs only).
    """
    m = cfg.model
    c, f, y, x = latent_shape
    pt, ph, pw = m.patch_size
    L = (f // pt) * (y // ph) * (x // pw)
    T = text_len
    D, M = m.inner_dim, m.ffn_dim
    patch = c * pt * ph * pw
    block = (8 * L * D * D + 4 * L * L * D + 4 * L * D * D + 4 * T * D * D + 4 * L * T * D
             + 4 * L * D * M)
    fwd = (m.num_layers * block + 2 * L * patch * D + 2 * T * m.text_dim * D + 2 * T * D * D
           + 2 * L * D * m.out_channels * pt * ph * pw)
    return 3.0 * fwd

