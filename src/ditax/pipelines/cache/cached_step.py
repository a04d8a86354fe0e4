"""The step-cached denoise step: the plain step (:mod:`ditax.pipelines.denoise`) with a
denoiser forward that may reuse the cached residual of the blocks, decided on the device.

Per branch the forward embeds its inputs, asks the method's rule which of its rows may skip
(:func:`decide`: one decision per request, from that request's own carry entries), then under
``lax.cond`` either adds the cached residual (every row skips) or runs the (remaining) blocks
for all rows, each row taking the computed tokens or, where it decided to skip, its own cached
residual (``jnp.where`` on the row mask), and runs the output head. So every request of a batch
gets what it gets alone, and the blocks run on the steps where some request needs them. The
decision state is the carry (:mod:`.carry`); the per-step tables (forced steps, threshold, the
model's numbers, CFG-reuse steps) are an argument, so one compiled program serves every step,
threshold and prompt.

Tokens may be one array ``[B, L', D]`` or a pytree of streams (LTX-2's ``(video, audio)``):
the residual is then that pytree, a change is measured over every stream's real tokens
together (as if concatenated), and a skipped step re-applies each stream's own residual.

A family's own guidance (its rule's ``guide``, :func:`~ditax.pipelines.denoise.guide_rule`)
is applied as in the plain step; the further forwards it runs on the conditional rows (its
rule's ``extra_branches``: LTX-2's spatio-temporal-guidance and modality-isolation passes) go
through the cached forward too, each as a branch of its own with its own carry entries and its
own decisions (:class:`ExtraBranches`), as the unconditional branch has: the guide sees, per
branch, what that branch's rule chose (computed or its own cached residual), never another
branch's output.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.pipelines.cache.carry import constrain_carry, entries, token_axes
from ditax.pipelines.cache.policy import CALIBRATE, METHODS, RAN, REUSED, SKIPPED, Policy
from ditax.models.base import num_blocks
from ditax.pipelines.denoise import (UNCOND, cfg_branches, cond_branch, guide, guide_rule,
                                     scheduler_update, step_inputs, uncond_rule)


def _leaves(tree) -> list:
    return jax.tree.leaves(tree)


def rows_of(h) -> int:
    """The rows (batch) of tokens ``h`` (an array or a pytree of streams)."""
    return _leaves(h)[0].shape[0]


def real(h, seq):
    """Each stream's real tokens ``h[:, :seq]`` (``seq``: an int, or a pytree like ``h``)."""
    return jax.tree.map(lambda a, s: a[:, :s], h, seq)


def rel_l1(new, old):
    """Per row: ``mean|new - old| / mean|old|`` (float32; inf where ``old`` is all zero) over
    every element of every leaf (a pytree: as if its leaves were concatenated)."""
    if len(_leaves(new)) == 1:
        new, old = _leaves(new)[0], _leaves(old)[0]
        axes = tuple(range(1, new.ndim))
        new, old = new.astype(jnp.float32), old.astype(jnp.float32)
        return jnp.mean(jnp.abs(new - old), axes) / jnp.mean(jnp.abs(old), axes)
    f32 = jnp.float32
    total = lambda a: jnp.sum(a, tuple(range(1, a.ndim)))    # noqa: E731
    diff = sum(total(jnp.abs(a.astype(f32) - b.astype(f32)))
               for a, b in zip(_leaves(new), _leaves(old)))
    return diff / sum(total(jnp.abs(b.astype(f32))) for b in _leaves(old))


def per_request(ok, branches: int):
    """``ok [b]`` over a forward's rows (``branches`` branch blocks of the batch's requests) →
    ``[b]``: True on every row of a request where it is True on all of that request's rows (a
    batched CFG forward skips a request's step only when both its branches may)."""
    return jnp.tile(ok.reshape(branches, -1).all(0), branches)


def rowwise(mask, a):
    """``mask [b]`` shaped to broadcast over ``a [b, ...]``."""
    return mask.reshape(mask.shape + (1,) * (a.ndim - 1))


def where_rows(mask, a, b):
    """Per row (and leaf): ``a`` where ``mask [b]``, else ``b``."""
    return jax.tree.map(lambda x, y: jnp.where(rowwise(mask, x), x, y), a, b)


def decide(policy: Policy, tables, model, h, ctx, carry: dict, i, branches: slice):
    """The method's rule for the branches ``branches`` at step ``i``, per request: ``(skip
    [b] bool (one value a row of the forward), h, first block to run, (acc, ratio, run),
    carry)``. first_block runs block 0 here (``h`` is then its output and the cached residual
    adds to it); the carry comes back with ``prev`` updated."""
    nbr = branches.stop - branches.start
    b = rows_of(h)
    rows = entries(branches, b // nbr)
    get = lambda a: jax.tree.map(lambda x: x[rows], a)                      # noqa: E731
    put = lambda a, v: jax.tree.map(lambda x, y: x.at[rows].set(y), a, v)   # noqa: E731
    force = tables["force"][i]
    thr = tables["threshold"]
    acc, ratio, run = get(carry["acc"]), get(carry["ratio"]), get(carry["run"])
    if policy.method == "first_block":
        h1 = model.run_blocks(h, ctx, 0, 1)
        r1 = jax.tree.map(lambda a, x: a - x, h1, h)
        prev = get(carry["prev"])
        skip = jnp.logical_and(~force, per_request(
            rel_l1(real(r1, ctx.seq), real(prev, ctx.seq)) < thr, nbr))
        carry["prev"] = put(carry["prev"], where_rows(
            skip, prev, jax.tree.map(lambda r, p: r.astype(p.dtype), r1, prev)))
        return skip, h1, 1, (acc, ratio, run), carry
    if policy.method == "teacache":
        cur = (ctx.mod if policy.teacache_input == "modulation" else ctx.temb).astype(jnp.float32)
        rel = rel_l1(cur, get(carry["prev"]))
        cand = acc + jnp.polyval(tables["poly"], jnp.where(jnp.isfinite(rel), rel, 0.0))
        skip = jnp.logical_and(~force, per_request(cand < thr, nbr))
        acc = jnp.where(skip, cand, 0.0)
        carry["prev"] = put(carry["prev"], cur)
        return skip, h, 0, (acc, ratio, run), carry
    if policy.method == "magcache":
        # the model's ratio of each branch, for each of its requests
        r_cand = ratio * jnp.repeat(tables["mag"][i, branches], b // nbr)
        run_cand = run + 1
        err_cand = acc + jnp.abs(1.0 - r_cand)
        ok = jnp.logical_and(err_cand < thr, run_cand <= tables["max_skip"])
        skip = jnp.logical_and(~force, per_request(ok, nbr))
        acc = jnp.where(skip, err_cand, 0.0)
        ratio = jnp.where(skip, r_cand, 1.0)
        run = jnp.where(skip, run_cand, 0)
        return skip, h, 0, (acc, ratio, run), carry
    # CFG reuse only, or CALIBRATE: every row runs
    return jnp.zeros((b,), bool), h, 0, (acc, ratio, run), carry


def measure(ctx, out, residual, cached, carry: dict, i, rows: slice) -> dict:
    """Calibration: record this step's changes since the previous step (``m_*`` of
    :mod:`.carry`; 1.0 at step 0) for the carry entries ``rows`` and keep what the next step
    compares with. ``m_ratio`` is the mean over every stream's real tokens of ``|r_t| /
    |r_{t-1}|``."""
    get = lambda a: a[rows]                          # noqa: E731
    put = lambda a, v: a.at[rows].set(v)             # noqa: E731
    mod, temb = ctx.mod.astype(jnp.float32), ctx.temb.astype(jnp.float32)
    o = out.astype(jnp.float32)
    norm = lambda r: jnp.linalg.norm(r.astype(jnp.float32), axis=-1)  # noqa: E731
    token_ratios = [norm(r) / norm(c) for r, c in zip(_leaves(real(residual, ctx.seq)),
                                                      _leaves(real(cached, ctx.seq)))]
    measured = dict(m_modulation=rel_l1(mod, get(carry["prev_mod"])),
                    m_time_embedding=rel_l1(temb, get(carry["prev_temb"])),
                    m_output=rel_l1(o, get(carry["prev_out"])),
                    m_ratio=jnp.mean(jnp.concatenate(token_ratios, axis=1), axis=-1))
    for k, v in measured.items():
        carry[k] = carry[k].at[i, rows].set(jnp.where(i > 0, v, 1.0))
    carry.update(prev_mod=put(carry["prev_mod"], mod), prev_temb=put(carry["prev_temb"], temb),
                 prev_out=put(carry["prev_out"], o))
    return carry


def cached_forward(gdef, policy: Policy, tables, params, i):
    """The :data:`~ditax.pipelines.denoise.Forward` of step ``i`` under the cache policy: the
    denoiser on the branches ``branches`` of the batch's requests (``x [b, C_in, ...]``,
    timestep ``[b]`` or ``[b, L]``, text ``[b, T, Dt]``, the family's extra inputs; ``b`` =
    branches x requests) → ``(output [b, C, ...], carry)``, through the protocol of
    :class:`~ditax.models.base.Denoiser` (``embed`` / ``run_blocks`` / ``head``).

    When every row skips, the cached residuals are added (no block runs); otherwise the blocks
    run for all rows and a row that decided to skip takes its cached residual instead of the
    computed tokens (a batch of one has no such row: the computed tokens as they are). The
    model is merged from ``params`` inside each ``lax.cond`` branch that runs blocks (NNX
    modules do not cross into a branch's trace; the parameters go in as an operand)."""
    def forward(x, tb, text, extras, branches, carry):
        model = nnx.merge(gdef, params)
        h, ctx = model.embed(x, tb, text, **extras)
        carry = dict(carry)
        n = x.shape[0] // (branches.stop - branches.start)      # requests in the batch
        rows = entries(branches, n)
        start = h                                    # the tokens the cached residual adds to
        skip, h, first, (acc, ratio, run), carry = decide(policy, tables, model, h, ctx, carry,
                                                          i, branches)
        start = h if policy.method == "first_block" else start
        cached = jax.tree.map(lambda a: a[rows], carry["residual"])

        def reused(h):
            return jax.tree.map(lambda a, c: (a.astype(jnp.float32)
                                              + c.astype(jnp.float32)).astype(a.dtype),
                                h, cached)

        def minus(out, h):
            return jax.tree.map(lambda o, a, c: (o - a).astype(c.dtype), out, h, cached)

        if policy.method in METHODS:
            def compute(ops):
                p, h = ops
                out = nnx.merge(gdef, p).run_blocks(h, ctx, first, num_blocks(model))
                residual = minus(out, h)
                if n > 1:   # the requests that decided to skip get what they get alone
                    out = where_rows(skip, reused(h), out)
                    residual = where_rows(skip, cached, residual)
                return out, residual

            def reuse(ops):
                return reused(ops[1]), cached

            h, residual = jax.lax.cond(jnp.all(skip), reuse, compute, (params, h))
        else:
            h = model.run_blocks(h, ctx)
            residual = minus(h, start)
        out = model.head(h, ctx)
        if policy.method == CALIBRATE:
            carry = measure(ctx, out, residual, cached, carry, i, rows)
        put = lambda a, v: a.at[rows].set(v)         # noqa: E731
        carry.update(residual=jax.tree.map(put, carry["residual"], residual),
                     acc=put(carry["acc"], acc), ratio=put(carry["ratio"], ratio),
                     run=put(carry["run"], run))
        carry["per_step"] = carry["per_step"].at[i, rows].set(jnp.where(skip, SKIPPED, RAN))
        return out, carry
    return forward


def extra_branches(inputs) -> tuple[str, ...]:
    """The names of the further forwards a family's guide rule runs on the conditional rows,
    in the order it runs them (its rule's ``extra_branches``; none by default)."""
    return tuple(getattr(inputs, "extra_branches", ()))


class ExtraBranches:
    """The denoiser as a family's guide rule sees it in a cached step: attributes are the
    model's, and its k-th call (``model(x, timestep, text, **extras)``, a further forward of
    the conditional rows) is the k-th of :func:`extra_branches`, run through the cached
    forward on that branch's own carry entries (branch slot ``first + k``). ``carry`` is the
    carry after the calls (read it after the guide rule returned)."""

    def __init__(self, model, forward, first: int, names: tuple[str, ...], carry: dict):
        self._model, self._forward, self._first, self._names = model, forward, first, names
        self.carry = carry
        self.calls = 0

    def __call__(self, x, timestep, text, **extras):
        k = self.calls
        if k >= len(self._names):
            raise ValueError(f"the guide rule runs more further forwards than its "
                             f"extra_branches {self._names} declare (a bug of the family's "
                             f"ModelInputs rule)")
        self.calls += 1
        slot = slice(self._first + k, self._first + k + 1)
        out, self.carry = self._forward(x, timestep, text, extras, slot, self.carry)
        return out

    def __getattr__(self, name):
        return getattr(self._model, name)

    def done(self) -> dict:
        """The carry, once every declared branch ran (else the rule and its declaration
        disagree: a bug of the family's rule)."""
        if self.calls != len(self._names):
            raise ValueError(f"the guide rule ran {self.calls} further forward(s) but its "
                             f"extra_branches declare {self._names} (a bug of the family's "
                             f"ModelInputs rule)")
        return self.carry


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4, 5))
def cached_denoise_step(gdef, inputs, scheduler, cfg_mode: str, use_cfg: bool, policy: Policy,
                        params, sched_state, latents, text, guidance, tables, carry,
                        condition=None):
    """The pipeline's denoise step (:func:`~ditax.pipelines.denoise._denoise_step`: same
    inputs, same guidance and scheduler update) with step caching: also takes the per-step
    ``tables`` and the ``carry``, returns ``(latents, sched_state, carry)``."""
    model = nnx.merge(gdef, params)
    i = sched_state.step_index
    uncond_extras = uncond_rule(inputs)
    own = guide_rule(inputs)
    names = extra_branches(inputs)
    _, step_in = step_inputs(model, inputs, sched_state, latents, condition)
    forward = cached_forward(gdef, policy, tables, params, i)
    if not use_cfg:
        cond, carry = cond_branch(forward, step_in, text, carry)
        uncond = None
    else:
        def both(ops):
            params, carry = ops
            cond, uncond, carry = cfg_branches(cached_forward(gdef, policy, tables, params, i),
                                               cfg_mode, step_in, text, carry, uncond_extras)
            if policy.cfg_cache:
                carry = dict(carry, cfg_diff=(uncond.astype(jnp.float32)
                                              - cond.astype(jnp.float32)))
            return cond, uncond, carry

        def cond_only(ops):
            params, carry = ops
            cond, carry = cond_branch(cached_forward(gdef, policy, tables, params, i), step_in,
                                      text, carry)
            uncond = (cond.astype(jnp.float32) + carry["cfg_diff"]).astype(cond.dtype)
            carry = dict(carry, per_step=carry["per_step"].at[
                i, entries(UNCOND, latents.shape[0])].set(REUSED))
            return cond, uncond, carry

        if policy.cfg_cache:
            cond, uncond, carry = jax.lax.cond(tables["cfg_reuse"][i], cond_only, both,
                                               (params, carry))
        else:
            cond, uncond, carry = both((params, carry))
    if own is None:
        v = cond if uncond is None else guide(cond, uncond, guidance)
    else:       # the family's guidance; its further forwards are branches of their own
        branches = ExtraBranches(model, forward, 2 if use_cfg else 1, names, carry)
        v = own(branches, step_in, text, cond, uncond, guidance)
        carry = branches.done()
    new, sched_state = scheduler_update(scheduler, sched_state, v, latents)
    return new, sched_state, constrain_carry(carry, model.mesh, token_axes(model))


__all__ = ["ExtraBranches", "cached_denoise_step", "cached_forward", "decide",
           "extra_branches", "measure", "per_request", "real", "rel_l1", "rowwise",
           "rows_of", "where_rows"]
