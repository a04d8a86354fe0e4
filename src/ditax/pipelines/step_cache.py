"""Step caching: skip transformer evaluations inside the one compiled denoise step.

``pipe(..., cache=None | "first_block" | "teacache" | "magcache", cache_threshold=None,
cfg_cache=False)``. Every method caches, per CFG branch, the *residual* of the transformer
blocks (tokens after the blocks minus tokens before) of the last step that ran them; a skipped
step embeds its inputs, adds that residual and runs the output head (the embedding and head
are a few percent of the work). The choice is made on the device with ``lax.cond``; the
decision state (cached residual, accumulators, counters) is a carry that goes into and comes
out of the compiled step, so the same program serves every step, every threshold and every
prompt: nothing recompiles between steps.

Methods (threshold ``None`` = the default in :data:`DEFAULT_THRESHOLD`):

- ``first_block`` (first-block cache, as diffusers' ``FirstBlockCache``): run block 0; if the
  relative L1 change of its residual since the last step that ran every block,
  ``mean|r0 - r0_prev| / mean|r0_prev|``, is below the threshold, reuse the cached residual of
  blocks 1..L-1. Needs no per-model numbers.
- ``teacache`` (TeaCache): accumulate ``poly(rel_L1(m_t, m_{t-1}))`` of the timestep-modulated
  input ``m`` (the blocks' modulation ``[B, 6, D]``, or the time embedding ``[B, D]``) with the
  model's polynomial; skip while the sum stays below the threshold, reset it when a step
  runs. The first ``round(N * retention_ratio)`` steps always run (and the last, where the
  model's numbers say so).
- ``magcache`` (MagCache): per branch, multiply the model's per-step magnitude ratios since the
  last computed step, add ``|1 - product|`` to an error; skip while the error is below the
  threshold and at most ``max_skip_steps`` (K) steps in a row were skipped; reset when a step
  runs. The first ``round(N * retention_ratio)`` steps always run.
- ``cfg_cache=True`` (CFG reuse, after FasterCache): on chosen steps the unconditional branch
  is not evaluated; its output is the conditional output plus the difference
  ``uncond - cond`` of the last step that evaluated both. Chosen steps: those with timestep
  below :data:`CFG_REUSE_BELOW` x ``num_train_timesteps`` (the low-noise part, where the
  difference changes slowly), except every :data:`CFG_REFRESH_EVERY`-th of them (counting
  from the first, which refreshes the difference). FasterCache additionally re-weights the
  difference's low and high frequencies; this is the plain difference.

With ``cfg_mode="batched"`` both branches run in one batch-2 forward, so a step is skipped
only when both branches' rules say so (each branch keeps its own accumulators); with
``"sequential"`` each branch decides alone. Steps where a Wan 2.2 pipeline switches expert
always run (the cached residual is the other expert's).

TeaCache and MagCache take per-model numbers (:mod:`.cache_numbers`); the Wan 2.1 T2V 1.3B and
14B ones are shipped, ``ditax calibrate-cache`` measures any other model. ``pipe.last_stats``
reports, per call: ``steps``, ``transformer_calls`` (full evaluations, each CFG branch counted),
the computed / skipped / CFG-reused steps per branch.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from ditax.errors import RequestError
from ditax.pipelines.cache_numbers import ModelNumbers, describe, find_numbers
from ditax.parallel.axes import batch_shards
from ditax.parallel.rules import activation_spec

METHODS = ("first_block", "teacache", "magcache")
CALIBRATE = "calibrate"     # ditax calibrate-cache: every step runs, measurements recorded
DEFAULT_THRESHOLD = {"first_block": 0.05, "teacache": 0.2, "magcache": 0.12}
CFG_REUSE_BELOW = 0.641     # FasterCache's unconditional-skip timestep range (641 of 1000)
CFG_REFRESH_EVERY = 5       # ... evaluating the unconditional branch every 5th step there

# per-step codes in last_stats["per_step"]
REUSED, RAN, SKIPPED = 0, 1, 2
TOKENS = ("act_batch", "act_seq", "act_embed")


@dataclass(frozen=True)
class Policy:
    """The static part of a cached step (part of the compiled program's key)."""

    method: str | None          # METHODS, CALIBRATE, or None (CFG reuse only)
    cfg_cache: bool
    teacache_input: str = "modulation"


def check_cache_args(cache, cache_threshold, cfg_cache) -> None:
    """Raise :class:`RequestError` for a cache request that is wrong whatever the model."""
    if cache is not None and cache not in METHODS + (CALIBRATE,):
        import difflib

        close = difflib.get_close_matches(str(cache), METHODS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise RequestError(f"cache={cache!r} is not one of {', '.join(METHODS)} (or None for no "
                           f"step caching){hint}")
    if cache_threshold is not None:
        if cache is None or cache == CALIBRATE:
            raise RequestError(f"cache_threshold={cache_threshold} needs a cache method; set "
                               f"cache to one of {', '.join(METHODS)} or drop the threshold")
        if (isinstance(cache_threshold, bool) or not isinstance(cache_threshold, (int, float))
                or not math.isfinite(cache_threshold) or cache_threshold < 0):
            raise RequestError(f"cache_threshold={cache_threshold!r} must be a number >= 0 "
                               f"(None = {DEFAULT_THRESHOLD[cache]} for {cache}; larger skips "
                               f"more steps)")
    if not isinstance(cfg_cache, bool):
        raise RequestError(f"cfg_cache={cfg_cache!r} must be True or False")


def cfg_reuse_steps(timesteps: np.ndarray, num_train_timesteps: int) -> np.ndarray:
    """``[N]`` bool: the steps whose unconditional branch is replaced (see the module doc)."""
    low = np.asarray(timesteps, np.float64) < CFG_REUSE_BELOW * num_train_timesteps
    out = np.zeros(len(low), bool)
    idx = np.flatnonzero(low)
    out[idx] = np.arange(len(idx)) % CFG_REFRESH_EVERY != 0
    return out


class StepCache:
    """One call's step cache: its policy and per-step tables, the carry, and the stats.

    Built by :func:`plan_step_cache`; :meth:`compile` returns the step callable the pipeline's
    loop calls like the uncached one (``x, state = step(params, state, x, text, g)``).
    """

    def __init__(self, policy: Policy, tables: dict, *, threshold: float | None,
                 numbers: ModelNumbers | None, num_branches: int, mesh):
        self.policy = policy
        self.tables = tables
        self.threshold = threshold
        self.numbers = numbers
        self.num_branches = num_branches
        self.mesh = mesh
        self.carry = None

    def _place(self, tree, spec_of):
        if self.mesh is None:
            return tree
        return jax.tree.map(lambda a, s: jax.device_put(a, NamedSharding(self.mesh, s)),
                            tree, spec_of(tree))

    def compile(self, programs, transformer, scheduler, cfg_mode: str, use_cfg: bool, state,
                x, text):
        """The compiled cached step for this expert (programs are shared by signature)."""
        if self.carry is None:
            self.carry = init_carry(transformer, self.policy, x, text, self.num_branches,
                                    len(self.tables["force"]))
            self.carry = self._place(self.carry, lambda t: carry_specs(t, self.mesh))
            self.tables = self._place(self.tables, lambda t: jax.tree.map(lambda _: P(), t))
        static = (transformer._gdef, scheduler, cfg_mode, use_cfg, self.policy)
        program = programs.step(cached_denoise_step, static,
                                (transformer._state, state, x, text, jnp.float32(0),
                                 self.tables, self.carry))

        def step(params, state, x, text, guidance):
            x, state, self.carry = program(params, state, x, text, guidance, self.tables,
                                           self.carry)
            return x, state
        return step

    def stats(self) -> dict:
        """``pipe.last_stats`` of the call (one device read, after the loop)."""
        per_step = np.asarray(self.carry["per_step"])          # [N, branches]
        names = ("cond", "uncond")[:self.num_branches]
        out = dict(steps=int(per_step.shape[0]),
                   transformer_calls=int((per_step == RAN).sum()),
                   cache=self.policy.method if self.policy.method != CALIBRATE else None,
                   cache_threshold=self.threshold, cfg_cache=self.policy.cfg_cache,
                   cache_numbers=None if self.numbers is None else self.numbers.name,
                   computed_steps={n: np.flatnonzero(per_step[:, b] == RAN).tolist()
                                   for b, n in enumerate(names)},
                   skipped_steps={n: np.flatnonzero(per_step[:, b] == SKIPPED).tolist()
                                  for b, n in enumerate(names)})
        if self.num_branches == 2:
            out["cfg_reused_steps"] = np.flatnonzero(per_step[:, 1] == REUSED).tolist()
        if self.policy.method == CALIBRATE:
            out["calibration"] = {k: np.asarray(self.carry[k]).tolist()
                                  for k in ("m_modulation", "m_time_embedding", "m_output",
                                            "m_ratio")}
        return out


def uncached_stats(num_steps: int, use_cfg: bool) -> dict:
    """``pipe.last_stats`` of a call without step caching."""
    names = ("cond", "uncond") if use_cfg else ("cond",)
    every = list(range(num_steps))
    return dict(steps=num_steps, transformer_calls=num_steps * len(names), cache=None,
                cache_threshold=None, cfg_cache=False, cache_numbers=None,
                computed_steps={n: every for n in names}, skipped_steps={n: [] for n in names})


def plan_step_cache(cache, cache_threshold, cfg_cache, *, use_cfg: bool, cfg_mode: str, mesh,
                    timesteps, num_train_timesteps: int, config, experts: list,
                    coefficients=None) -> StepCache | None:
    """Check a cache request against this call and build its :class:`StepCache` (None: no
    step caching, the pipeline runs its plain step). ``experts``: the transformer of each
    step (a switch forces a full step); ``coefficients``: a numbers file (or None: shipped)."""
    check_cache_args(cache, cache_threshold, cfg_cache)
    if cache is None and not cfg_cache:
        return None
    if cfg_cache and not use_cfg:
        raise RequestError("cfg_cache=True reuses the unconditional branch of classifier-free "
                           "guidance, which is off (guidance_scale <= 1); raise guidance_scale "
                           "or drop cfg_cache")
    if cfg_cache and cfg_mode == "batched" and batch_shards(mesh) > 1:
        raise RequestError(f"cfg_cache=True runs the conditional branch alone (batch 1) on "
                           f"reuse steps, which cannot be split over mesh data*fsdp="
                           f"{batch_shards(mesh)}; put the devices on mesh.context or drop "
                           f"cfg_cache")
    n = len(timesteps)
    num_experts = len({id(e) for e in experts})
    numbers = None
    force = np.zeros(n, bool)
    force[0] = True
    force[1:] |= np.array([experts[i] is not experts[i - 1] for i in range(1, n)], bool)
    tables = dict(force=force, threshold=np.float32(
        DEFAULT_THRESHOLD.get(cache, 0.0) if cache_threshold is None else cache_threshold),
        cfg_reuse=(cfg_reuse_steps(timesteps, num_train_timesteps) if cfg_cache
                   else np.zeros(n, bool)))
    policy = Policy(cache, cfg_cache)
    if cache in ("teacache", "magcache"):
        numbers = find_numbers(config, 2 if num_experts > 1 else 1, coefficients)
        if numbers is None or getattr(numbers, cache) is None:
            raise RequestError(
                f"cache={cache!r} needs per-model numbers and none are known for this model "
                f"({describe(config)}, {num_experts} expert(s)); measure them with `ditax "
                f"calibrate-cache MODEL --output numbers.json` and pass cache_coefficients="
                f"numbers.json (config key sample.cache_coefficients), or use "
                f"cache='first_block' (no numbers needed)")
        part = getattr(numbers, cache)
        keep = max(1, round(n * part.retention_ratio))
        force[:keep] = True
        if cache == "teacache":
            policy = Policy(cache, cfg_cache, part.input)
            tables["poly"] = np.asarray(part.coefficients, np.float32)
            if part.compute_last:
                force[-1] = True
        else:
            tables["mag"] = part.per_step(n)
            tables["max_skip"] = np.int32(part.max_skip_steps)
    tables["force"] = force
    threshold = None if cache in (None, CALIBRATE) else float(
        DEFAULT_THRESHOLD[cache] if cache_threshold is None else cache_threshold)
    return StepCache(policy, tables, threshold=threshold, numbers=numbers,
                     num_branches=2 if use_cfg else 1, mesh=mesh)


# ----------------------------------------------------------------------------------------------
# the carry


def _embed_shapes(transformer, x, text, nb):
    """Abstract ``(h, mod, temb)`` of an embed of ``nb`` branches."""
    def embed(params):
        model = nnx.merge(transformer._gdef, params)
        xs = jnp.zeros((nb,) + x.shape[1:], jnp.dtype(model.cfg.dtype))
        h, ctx = model.embed(xs, jnp.zeros((nb,), jnp.float32), jnp.zeros(
            (nb,) + text.shape[1:], text.dtype))
        return h, ctx.mod, ctx.temb
    return jax.eval_shape(embed, transformer._state)


def init_carry(transformer, policy: Policy, x, text, nb: int, n: int) -> dict:
    """The zero carry of a call: cached residual ``[nb, L', D]``, per-branch accumulators,
    per-step codes ``[N, nb]`` and what the method compares between steps."""
    h, mod, temb = _embed_shapes(transformer, x, text, nb)
    z = lambda s, d=jnp.float32: jnp.zeros(s, d)   # noqa: E731
    carry = dict(residual=z(h.shape, h.dtype), per_step=z((n, nb), jnp.int32),
                 acc=z((nb,)), ratio=jnp.ones((nb,), jnp.float32), run=z((nb,), jnp.int32))
    if policy.method == "first_block":
        carry["prev"] = z(h.shape, h.dtype)
    elif policy.method == "teacache":
        carry["prev"] = z((mod if policy.teacache_input == "modulation" else temb).shape)
    elif policy.method == CALIBRATE:
        carry.update(prev_mod=z(mod.shape), prev_temb=z(temb.shape),
                     prev_out=z((nb,) + x.shape[1:]),
                     **{k: z((n, nb)) for k in ("m_modulation", "m_time_embedding", "m_output",
                                                "m_ratio")})
    if policy.cfg_cache:
        carry["cfg_diff"] = z((1,) + x.shape[1:])
    return carry


def carry_specs(carry: dict, mesh) -> dict:
    """Token-shaped entries are sharded like the blocks' activations; the rest replicated."""
    tokens = activation_spec(TOKENS, mesh)
    token_shape = carry["residual"].shape
    return {k: tokens if k in ("residual", "prev") and v.shape == token_shape else P()
            for k, v in carry.items()}


def _constrain_carry(carry: dict, mesh) -> dict:
    if mesh is None:
        return carry
    specs = carry_specs(carry, mesh)
    return {k: jax.lax.with_sharding_constraint(v, NamedSharding(mesh, specs[k]))
            for k, v in carry.items()}


# ----------------------------------------------------------------------------------------------
# the compiled step


def _rel_l1(new, old):
    """Per row: ``mean|new - old| / mean|old|`` (float32; inf where ``old`` is all zero)."""
    axes = tuple(range(1, new.ndim))
    new, old = new.astype(jnp.float32), old.astype(jnp.float32)
    return jnp.mean(jnp.abs(new - old), axes) / jnp.mean(jnp.abs(old), axes)


def _forward(gdef, policy: Policy, tables, params, carry, i, x, t, text, rows: slice):
    """The transformer on branches ``rows`` (``x [b, C, F, Y, X]``, text ``[b, T, Dt]``) under
    the cache policy. Returns ``(output [b, C, F, Y, X], carry)``.

    The model is merged from ``params`` inside each ``lax.cond`` branch that runs blocks (NNX
    modules do not cross into a branch's trace; the parameters go in as an operand)."""
    model = nnx.merge(gdef, params)
    b = x.shape[0]
    h, ctx = model.embed(x, jnp.full((b,), t), text)
    L = model.cfg.num_layers
    seq = ctx.seq
    get = lambda a: a[rows]                          # noqa: E731
    put = lambda a, v: a.at[rows].set(v)             # noqa: E731
    force = tables["force"][i]
    thr = tables["threshold"]
    acc, ratio, run = get(carry["acc"]), get(carry["ratio"]), get(carry["run"])
    carry = dict(carry)
    start = h                                        # the tokens the cached residual adds to

    if policy.method == "first_block":
        h1 = model.run_blocks(h, ctx, 0, 1)
        r1 = (h1 - h)[:, :seq]
        prev = get(carry["prev"])
        skip = jnp.logical_and(~force, jnp.all(_rel_l1(r1, prev[:, :seq]) < thr))
        carry["prev"] = put(carry["prev"], jnp.where(skip, prev, (h1 - h).astype(prev.dtype)))
        h, start, first = h1, h1, 1
    elif policy.method == "teacache":
        cur = (ctx.mod if policy.teacache_input == "modulation" else ctx.temb).astype(jnp.float32)
        rel = _rel_l1(cur, get(carry["prev"]))
        cand = acc + jnp.polyval(tables["poly"], jnp.where(jnp.isfinite(rel), rel, 0.0))
        skip = jnp.logical_and(~force, jnp.all(cand < thr))
        acc = jnp.where(skip, cand, 0.0)
        carry["prev"] = put(carry["prev"], cur)
        first = 0
    elif policy.method == "magcache":
        r_cand = ratio * tables["mag"][i, rows]
        run_cand = run + 1
        err_cand = acc + jnp.abs(1.0 - r_cand)
        ok = jnp.logical_and(err_cand < thr, run_cand <= tables["max_skip"])
        skip = jnp.logical_and(~force, jnp.all(ok))
        acc = jnp.where(skip, err_cand, 0.0)
        ratio = jnp.where(skip, r_cand, 1.0)
        run = jnp.where(skip, run_cand, 0)
        first = 0
    else:                                            # None (CFG reuse only) or CALIBRATE
        skip, first = jnp.bool_(False), 0

    cached = get(carry["residual"])
    if policy.method in METHODS:
        def compute(ops):
            p, h = ops
            out = nnx.merge(gdef, p).run_blocks(h, ctx, first, L)
            return out, (out - h).astype(cached.dtype)

        def reuse(ops):
            h = ops[1]
            return (h.astype(jnp.float32) + cached.astype(jnp.float32)).astype(h.dtype), cached

        h, residual = jax.lax.cond(skip, reuse, compute, (params, h))
    else:
        h = model.run_blocks(h, ctx)
        residual = (h - start).astype(cached.dtype)
    out = model.head(h, ctx)

    if policy.method == CALIBRATE:
        mod, temb = ctx.mod.astype(jnp.float32), ctx.temb.astype(jnp.float32)
        o = out.astype(jnp.float32)
        norm = lambda r: jnp.linalg.norm(r[:, :seq].astype(jnp.float32), axis=-1)  # noqa: E731
        measured = dict(m_modulation=_rel_l1(mod, get(carry["prev_mod"])),
                        m_time_embedding=_rel_l1(temb, get(carry["prev_temb"])),
                        m_output=_rel_l1(o, get(carry["prev_out"])),
                        m_ratio=jnp.mean(norm(residual) / norm(cached), axis=-1))
        for k, v in measured.items():
            carry[k] = carry[k].at[i, rows].set(jnp.where(i > 0, v, 1.0))
        carry.update(prev_mod=put(carry["prev_mod"], mod),
                     prev_temb=put(carry["prev_temb"], temb),
                     prev_out=put(carry["prev_out"], o))

    carry.update(residual=put(carry["residual"], residual), acc=put(carry["acc"], acc),
                 ratio=put(carry["ratio"], ratio), run=put(carry["run"], run))
    carry["per_step"] = carry["per_step"].at[i, rows].set(jnp.where(skip, SKIPPED, RAN))
    return out, carry


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4))
def cached_denoise_step(gdef, scheduler, cfg_mode: str, use_cfg: bool, policy: Policy, params,
                        sched_state, latents, text, guidance, tables, carry):
    """The pipeline's denoise step (see ``text_to_video._denoise_step``) with step caching:
    also takes the per-step ``tables`` and the ``carry``, returns ``(latents, sched_state,
    carry)``."""
    model = nnx.merge(gdef, params)
    dt = jnp.dtype(model.cfg.dtype)
    mesh = model.mesh
    i = sched_state.step_index
    t = sched_state.timesteps[i].astype(jnp.float32)
    x = latents.astype(dt)
    b = x.shape[0]
    fwd = functools.partial(_forward, gdef, policy, tables)
    if not use_cfg:
        v, carry = fwd(params, carry, i, x, t, text[:b], slice(0, 1))
    else:
        def both(ops):
            params, carry = ops
            if cfg_mode == "batched":
                out, carry = fwd(params, carry, i, jnp.concatenate([x, x]), t, text,
                                 slice(0, 2))
                cond, uncond = out[:b], out[b:]
            else:
                cond, carry = fwd(params, carry, i, x, t, text[:b], slice(0, 1))
                uncond, carry = fwd(params, carry, i, x, t, text[b:], slice(1, 2))
            if policy.cfg_cache:
                carry = dict(carry, cfg_diff=(uncond.astype(jnp.float32)
                                              - cond.astype(jnp.float32)))
            return cond, uncond, carry

        def cond_only(ops):
            params, carry = ops
            cond, carry = fwd(params, carry, i, x, t, text[:b], slice(0, 1))
            uncond = (cond.astype(jnp.float32) + carry["cfg_diff"]).astype(cond.dtype)
            carry = dict(carry, per_step=carry["per_step"].at[i, 1].set(REUSED))
            return cond, uncond, carry

        if policy.cfg_cache:
            cond, uncond, carry = jax.lax.cond(tables["cfg_reuse"][i], cond_only, both,
                                               (params, carry))
        else:
            cond, uncond, carry = both((params, carry))
        v = uncond + guidance.astype(cond.dtype) * (cond - uncond)
    new, sched_state = scheduler.step(sched_state, v, latents)
    return new.astype(latents.dtype), sched_state, _constrain_carry(carry, mesh)


__all__ = ["CALIBRATE", "CFG_REFRESH_EVERY", "CFG_REUSE_BELOW", "DEFAULT_THRESHOLD", "METHODS",
           "Policy", "StepCache", "cached_denoise_step", "cfg_reuse_steps", "check_cache_args",
           "plan_step_cache", "uncached_stats"]
