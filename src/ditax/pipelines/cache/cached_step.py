"""The step-cached denoise step: the plain step (:mod:`ditax.pipelines.denoise`) with a
denoiser forward that may reuse the cached residual of the blocks, decided on the device.

Per CFG branch the forward embeds its inputs, asks the method's rule which of its rows may skip
(:func:`decide`: one decision per request, from that request's own carry entries), then under
``lax.cond`` either adds the cached residual (every row skips) or runs the (remaining) blocks
for all rows, each row taking the computed tokens or, where it decided to skip, its own cached
residual (``jnp.where`` on the row mask), and runs the output head. So every request of a batch
gets what it gets alone, and the blocks run on the steps where some request needs them. The
decision state is the carry (:mod:`.carry`); the per-step tables (forced steps, threshold, the
model's numbers, CFG-reuse steps) are an argument, so one compiled program serves every step,
threshold and prompt.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.pipelines.cache.carry import constrain_carry, entries
from ditax.pipelines.cache.policy import CALIBRATE, METHODS, RAN, REUSED, SKIPPED, Policy
from ditax.models.base import num_blocks
from ditax.pipelines.denoise import (UNCOND, cfg_branches, cond_branch, guide,
                                     scheduler_update, step_inputs, uncond_rule)


def rel_l1(new, old):
    """Per row: ``mean|new - old| / mean|old|`` (float32; inf where ``old`` is all zero)."""
    axes = tuple(range(1, new.ndim))
    new, old = new.astype(jnp.float32), old.astype(jnp.float32)
    return jnp.mean(jnp.abs(new - old), axes) / jnp.mean(jnp.abs(old), axes)


def per_request(ok, branches: int):
    """``ok [b]`` over a forward's rows (``branches`` branch blocks of the batch's requests) →
    ``[b]``: True on every row of a request where it is True on all of that request's rows (a
    batched CFG forward skips a request's step only when both its branches may)."""
    return jnp.tile(ok.reshape(branches, -1).all(0), branches)


def rowwise(mask, a):
    """``mask [b]`` shaped to broadcast over ``a [b, ...]``."""
    return mask.reshape(mask.shape + (1,) * (a.ndim - 1))


def decide(policy: Policy, tables, model, h, ctx, carry: dict, i, branches: slice):
    """The method's rule for the CFG branches ``branches`` at step ``i``, per request: ``(skip
    [b] bool (one value a row of the forward), h, first block to run, (acc, ratio, run),
    carry)``. first_block runs block 0 here (``h`` is then its output and the cached residual
    adds to it); the carry comes back with ``prev`` updated."""
    nbr = branches.stop - branches.start
    rows = entries(branches, h.shape[0] // nbr)
    get = lambda a: a[rows]                          # noqa: E731
    put = lambda a, v: a.at[rows].set(v)             # noqa: E731
    force = tables["force"][i]
    thr = tables["threshold"]
    acc, ratio, run = get(carry["acc"]), get(carry["ratio"]), get(carry["run"])
    if policy.method == "first_block":
        seq = ctx.seq
        h1 = model.run_blocks(h, ctx, 0, 1)
        r1 = (h1 - h)[:, :seq]
        prev = get(carry["prev"])
        skip = jnp.logical_and(~force, per_request(rel_l1(r1, prev[:, :seq]) < thr, nbr))
        carry["prev"] = put(carry["prev"], jnp.where(rowwise(skip, prev), prev,
                                                     (h1 - h).astype(prev.dtype)))
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
        r_cand = ratio * jnp.repeat(tables["mag"][i, branches], h.shape[0] // nbr)
        run_cand = run + 1
        err_cand = acc + jnp.abs(1.0 - r_cand)
        ok = jnp.logical_and(err_cand < thr, run_cand <= tables["max_skip"])
        skip = jnp.logical_and(~force, per_request(ok, nbr))
        acc = jnp.where(skip, err_cand, 0.0)
        ratio = jnp.where(skip, r_cand, 1.0)
        run = jnp.where(skip, run_cand, 0)
        return skip, h, 0, (acc, ratio, run), carry
    # CFG reuse only, or CALIBRATE: every row runs
    return jnp.zeros(h.shape[:1], bool), h, 0, (acc, ratio, run), carry


def measure(ctx, out, residual, cached, carry: dict, i, rows: slice) -> dict:
    """Calibration: record this step's changes since the previous step (``m_*`` of
    :mod:`.carry`; 1.0 at step 0) for the carry entries ``rows`` and keep what the next step
    compares with."""
    get = lambda a: a[rows]                          # noqa: E731
    put = lambda a, v: a.at[rows].set(v)             # noqa: E731
    seq = ctx.seq
    mod, temb = ctx.mod.astype(jnp.float32), ctx.temb.astype(jnp.float32)
    o = out.astype(jnp.float32)
    norm = lambda r: jnp.linalg.norm(r[:, :seq].astype(jnp.float32), axis=-1)  # noqa: E731
    measured = dict(m_modulation=rel_l1(mod, get(carry["prev_mod"])),
                    m_time_embedding=rel_l1(temb, get(carry["prev_temb"])),
                    m_output=rel_l1(o, get(carry["prev_out"])),
                    m_ratio=jnp.mean(norm(residual) / norm(cached), axis=-1))
    for k, v in measured.items():
        carry[k] = carry[k].at[i, rows].set(jnp.where(i > 0, v, 1.0))
    carry.update(prev_mod=put(carry["prev_mod"], mod), prev_temb=put(carry["prev_temb"], temb),
                 prev_out=put(carry["prev_out"], o))
    return carry


def cached_forward(gdef, policy: Policy, tables, params, i):
    """The :data:`~ditax.pipelines.denoise.Forward` of step ``i`` under the cache policy: the
    denoiser on the CFG branches ``branches`` of the batch's requests (``x [b, C_in, ...]``,
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
        cached = carry["residual"][rows]

        def reused(h):
            return (h.astype(jnp.float32) + cached.astype(jnp.float32)).astype(h.dtype)

        if policy.method in METHODS:
            def compute(ops):
                p, h = ops
                out = nnx.merge(gdef, p).run_blocks(h, ctx, first, num_blocks(model))
                residual = (out - h).astype(cached.dtype)
                if n > 1:   # the requests that decided to skip get what they get alone
                    out = jnp.where(rowwise(skip, out), reused(h), out)
                    residual = jnp.where(rowwise(skip, residual), cached, residual)
                return out, residual

            def reuse(ops):
                return reused(ops[1]), cached

            h, residual = jax.lax.cond(jnp.all(skip), reuse, compute, (params, h))
        else:
            h = model.run_blocks(h, ctx)
            residual = (h - start).astype(cached.dtype)
        out = model.head(h, ctx)
        if policy.method == CALIBRATE:
            carry = measure(ctx, out, residual, cached, carry, i, rows)
        put = lambda a, v: a.at[rows].set(v)         # noqa: E731
        carry.update(residual=put(carry["residual"], residual), acc=put(carry["acc"], acc),
                     ratio=put(carry["ratio"], ratio), run=put(carry["run"], run))
        carry["per_step"] = carry["per_step"].at[i, rows].set(jnp.where(skip, SKIPPED, RAN))
        return out, carry
    return forward


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
    _, inputs = step_inputs(model, inputs, sched_state, latents, condition)
    if not use_cfg:
        v, carry = cond_branch(cached_forward(gdef, policy, tables, params, i), inputs, text,
                               carry)
    else:
        def both(ops):
            params, carry = ops
            cond, uncond, carry = cfg_branches(cached_forward(gdef, policy, tables, params, i),
                                               cfg_mode, inputs, text, carry, uncond_extras)
            if policy.cfg_cache:
                carry = dict(carry, cfg_diff=(uncond.astype(jnp.float32)
                                              - cond.astype(jnp.float32)))
            return cond, uncond, carry

        def cond_only(ops):
            params, carry = ops
            cond, carry = cond_branch(cached_forward(gdef, policy, tables, params, i), inputs,
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
        v = guide(cond, uncond, guidance)
    new, sched_state = scheduler_update(scheduler, sched_state, v, latents)
    return new, sched_state, constrain_carry(carry, model.mesh)


__all__ = ["cached_denoise_step", "cached_forward", "decide", "measure", "per_request", "rel_l1",
           "rowwise"]
