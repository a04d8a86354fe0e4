"""Step caching: skip transformer evaluations inside the one compiled denoise step.

``pipe(..., cache=None | "first_block" | "teacache" | "magcache", cache_threshold=None,
cfg_cache=False)``. Every method caches, per branch (the CFG branches, and the further
forwards of a family's own guidance, below), the *residual* of the transformer blocks (tokens
after the blocks minus tokens before) of the last step that ran them; a skipped step embeds its
inputs, adds that residual and runs the output head (the embedding and head are a few percent
of the work). Tokens that are a pytree of streams (LTX-2: ``(video [B, L', D], audio [B, La,
Da])``) have a residual of the same pytree: a skipped step re-applies each stream's own, and
the changes the rules measure (first_block's, calibration's) are taken over every stream's real
tokens together, as if concatenated. The choice is made on the device with ``lax.cond``; the
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

A family with its own guidance rule (LTX-2: per-stream CFG in the clean-sample space,
spatio-temporal guidance, modality isolation, rescaling) is guided by it as in the plain step.
Its further forwards of the conditional rows (its rule's ``extra_branches``: LTX-2's
``"stg"`` pass, with self-attention perturbed in the chosen blocks, and ``"modality"`` pass,
without the audio<->video attention) are branches of their own: each keeps its own residual and
accumulators and decides alone, as a sequential CFG branch does (first_block measures its own
block 0; TeaCache reads the same modulation as the conditional branch; MagCache uses the
conditional branch's ratios, the numbers holding only cond / uncond ones). So a skipped step
of such a branch is exactly that branch's cached residual re-applied, never another branch's
output; ``last_stats`` counts and lists them under their names, and CFG reuse
(``cfg_cache``) replaces only the unconditional branch. A family's condition goes into the
cached step as into the plain one (its :class:`~ditax.models.base.ModelInputs` rule), so for
Wan image-to-video the inputs, the per-token timesteps of Wan 2.2 TI2V (the modulation is then
``[B, L, 6, D]``) and the CLIP tokens are those of the plain step. The denoiser is reached
only through :class:`~ditax.models.base.Denoiser` (``embed`` / ``run_blocks`` / ``head``, the
context's ``seq`` / ``mod`` / ``temb``, ``block_stacks``).

Batches (:func:`ditax.pipelines.batch.sample_batch`: requests of one program shape and the same
cache settings, stacked): every request decides for itself. The carry keeps one entry per CFG
branch and request (:mod:`.carry`), each request's rule reads and updates only its own, and in a
batched CFG forward a request skips when both of its branches may. A step where every request
skips runs no block (the saving); a step where any request needs the blocks runs them for the
whole batch, and each request takes the computed tokens (it ran: its residual and accumulators
are those of a computed step) or, where it decided to skip, its own cached residual — so each
request's output is the one it gets alone, within the rounding of a wider matmul. MagCache
(per-step table) and, for Wan, TeaCache (the modulation depends on the timestep only) decide
alike for every request; first_block's measure is the request's own. The CFG-reuse schedule is
by step index, which the requests of a lock-step batch share, and ``cfg_diff`` is per request.

Where the parts live: :mod:`.policy` (method names, defaults, request checks, CFG-reuse
schedule), :mod:`.carry` (the decision state), :mod:`.cached_step` (the compiled step: the
plain step's inputs, guidance and scheduler update from :mod:`ditax.pipelines.denoise` around
a caching forward), this module (planning a call's cache and reading its stats).

TeaCache and MagCache take per-model numbers (:mod:`.numbers`); the Wan 2.1 T2V 1.3B and
14B ones are shipped, ``ditax calibrate-cache`` measures any other model. ``pipe.last_stats``
reports, per call: ``steps``, ``transformer_calls`` (full evaluations, each branch counted),
the computed / skipped / CFG-reused steps per branch. For a batch these say what the batch ran
(a call counts one forward over all of its requests; a step is computed for a branch when the
blocks ran for it, skipped when every request skipped), and ``rows`` lists each request's own
(``transformer_calls``, ``computed_steps``, ``skipped_steps``, ``cfg_reused_steps``: what it
would report alone); a batch of one reports exactly what its call does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from ditax.errors import RequestError
from ditax.parallel.axes import batch_shards
from ditax.pipelines.cache.carry import MEASURED, carry_specs, init_carry
from ditax.pipelines.cache.numbers import ModelNumbers, describe, find_numbers
from ditax.pipelines.cache.policy import (CALIBRATE, CFG_REFRESH_EVERY, CFG_REUSE_BELOW,
                                          DEFAULT_THRESHOLD, METHODS, RAN, REUSED, SKIPPED,
                                          Policy, check_cache_args, cfg_reuse_steps,
                                          uncached_stats)
from ditax.pipelines.cache.cached_step import cached_denoise_step, extra_branches
from ditax.pipelines.denoise import CARRY


class StepCache:
    """One call's step cache: its policy and per-step tables, the carry, and the stats.

    Built by :func:`plan_step_cache`; :meth:`compile` returns the step callable the pipeline's
    loop calls like the uncached one (``x, state = step(params, state, x, text, g,
    condition)``).
    """

    def __init__(self, policy: Policy, tables: dict, *, threshold: float | None,
                 numbers: ModelNumbers | None, use_cfg: bool):
        self.policy = policy
        self.tables = tables
        self.threshold = threshold
        self.numbers = numbers
        self.names = ("cond", "uncond") if use_cfg else ("cond",)   # + the extra branches
        self.carry = None
        self.axes = None

    @property
    def num_branches(self) -> int:
        return len(self.names)

    @staticmethod
    def _place(tree, spec_of, mesh):
        if mesh is None:
            return tree
        return jax.tree.map(lambda a, s: jax.device_put(a, NamedSharding(mesh, s)),
                            tree, spec_of(tree))

    def compile(self, programs, expert, inputs, scheduler, cfg_mode: str, use_cfg: bool,
                state, x, text, condition=None, *, mesh=None):
        """The compiled cached step for this expert (a
        :class:`~ditax.pipelines.sampling.Expert`; programs are shared by signature), called as
        the plain one: ``x, state = step(params, state, x, text, guidance, condition)``.
        ``inputs``: the family's :class:`~ditax.models.base.ModelInputs` rule; ``mesh``: the
        denoiser's (the carry and tables are placed on it)."""
        if self.carry is None:
            cfg = self.names
            self.names = cfg + extra_branches(inputs)
            if "mag" in self.tables:    # each branch's ratios: an extra one takes cond's
                self.tables["mag"] = self.tables["mag"][:, [cfg.index(n) if n in cfg else 0
                                                            for n in self.names]]
            self.carry, self.axes = init_carry(expert, inputs, self.policy, x, text,
                                               condition, len(cfg), self.num_branches,
                                               len(self.tables["force"]))
            self.carry = self._place(self.carry, lambda t: carry_specs(t, mesh, self.axes),
                                     mesh)
            self.tables = self._place(self.tables, lambda t: jax.tree.map(lambda _: P(), t),
                                      mesh)
        static = (expert.graphdef, inputs, scheduler, cfg_mode, use_cfg, self.policy)
        program = programs.step(cached_denoise_step, static,
                                (expert.params, state, x, text, jnp.float32(0),
                                 self.tables, self.carry, condition), carry=(*CARRY, 6))

        def step(params, state, x, text, guidance, condition):
            x, state, self.carry = program(params, state, x, text, guidance, self.tables,
                                           self.carry, condition)
            return x, state
        return step

    def stats(self) -> dict:
        """``pipe.last_stats`` of the call (one device read, after the loop): what the batch
        ran (module doc, "Batches"), and with more than one request each one's own in
        ``rows``."""
        nb = self.num_branches
        per_step = np.asarray(self.carry["per_step"])          # [N, branches x requests]
        steps = per_step.shape[0]
        codes = per_step.reshape(steps, nb, -1)                 # [N, branch, request]
        names = self.names
        ran = _steps_of(_batch_codes(codes), names)
        out = dict(steps=int(steps), transformer_calls=ran.pop("transformer_calls"),
                   cache=self.policy.method if self.policy.method != CALIBRATE else None,
                   cache_threshold=self.threshold, cfg_cache=self.policy.cfg_cache,
                   cache_numbers=None if self.numbers is None else self.numbers.name, **ran)
        if codes.shape[2] > 1:
            out["rows"] = [_steps_of(codes[:, :, r], names) for r in range(codes.shape[2])]
        if self.policy.method == CALIBRATE:    # [N, entries] each, entries branch-major
            out["calibration"] = {k: np.asarray(self.carry[k]).tolist() for k in MEASURED}
            out["calibration"]["branches"] = list(names)
        return out


def _batch_codes(codes: np.ndarray) -> np.ndarray:
    """``[N, branch]`` codes of the batch from ``[N, branch, request]``: ``RAN`` where the
    blocks ran for some request, ``SKIPPED`` where every request skipped, else (CFG reuse: the
    step index decides, so for every request alike) ``REUSED``."""
    return np.where((codes == RAN).any(2), RAN,
                    np.where((codes == SKIPPED).all(2), SKIPPED, REUSED))


def _steps_of(codes: np.ndarray, names: tuple) -> dict:
    """``transformer_calls`` and the computed / skipped (/ CFG-reused) steps of ``[N, branch]``
    codes."""
    out = dict(transformer_calls=int((codes == RAN).sum()),
               computed_steps={n: np.flatnonzero(codes[:, b] == RAN).tolist()
                               for b, n in enumerate(names)},
               skipped_steps={n: np.flatnonzero(codes[:, b] == SKIPPED).tolist()
                              for b, n in enumerate(names)})
    if "uncond" in names:
        out["cfg_reused_steps"] = np.flatnonzero(
            codes[:, names.index("uncond")] == REUSED).tolist()
    return out


def plan_step_cache(cache, cache_threshold, cfg_cache, *, use_cfg: bool, cfg_mode: str, mesh,
                    timesteps, num_train_timesteps: int, config, experts: list,
                    coefficients=None) -> StepCache | None:
    """Check a cache request against this call and build its :class:`StepCache` (None: no
    step caching, the pipeline runs its plain step). ``experts``: the transformer of each
    step (a switch forces a full step); ``config``: the denoiser's config (what TeaCache /
    MagCache numbers match on); ``coefficients``: a numbers file (or None: shipped)."""
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
                f"calibrate-cache --model MODEL --output numbers.json` and pass cache_coefficients="
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
    return StepCache(policy, tables, threshold=threshold, numbers=numbers, use_cfg=use_cfg)


__all__ = ["CALIBRATE", "CFG_REFRESH_EVERY", "CFG_REUSE_BELOW", "DEFAULT_THRESHOLD", "METHODS",
           "Policy", "StepCache", "cached_denoise_step", "cfg_reuse_steps", "check_cache_args",
           "plan_step_cache", "uncached_stats"]
