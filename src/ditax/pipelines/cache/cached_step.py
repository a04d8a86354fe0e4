"""The step-cached denoise step: the plain step (:mod:`ditax.pipelines.denoise`) with a
denoiser forward that may reuse the cached residual of the blocks, decided on the device.

Per CFG branch the forward embeds its inputs, asks the method's rule whether this step may
skip (:func:`decide`), then under ``lax.cond`` either runs the (remaining) blocks and records
their residual or adds the cached residual, and runs the output head. The decision state is the
carry (:mod:`.carry`); the per-step tables (forced steps, threshold, the model's numbers,
CFG-reuse steps) are an argument, so one compiled program serves every step, threshold and
prompt.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.pipelines.cache.carry import constrain_carry
from ditax.pipelines.cache.policy import CALIBRATE, METHODS, RAN, REUSED, SKIPPED, Policy
from ditax.models.base import num_blocks
from ditax.pipelines.denoise import (UNCOND, cfg_branches, cond_branch, guide,
                                     scheduler_update, step_inputs, uncond_rule)


def rel_l1(new, old):
    """Per row: ``mean|new - old| / mean|old|`` (float32; inf where ``old`` is all zero)."""
    axes = tuple(range(1, new.ndim))
    new, old = new.astype(jnp.float32), old.astype(jnp.float32)
    return jnp.mean(jnp.abs(new - old), axes) / jnp.mean(jnp.abs(old), axes)


def decide(policy: Policy, tables, model, h, ctx, carry: dict, i, rows: slice):
    """The method's rule for branches ``rows`` at step ``i``: ``(skip [] bool, h, first block to
    run, (acc, ratio, run), carry)``. first_block runs block 0 here (``h`` is then its output
    and the cached residual adds to it); the carry comes back with ``prev`` updated."""
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
        skip = jnp.logical_and(~force, jnp.all(rel_l1(r1, prev[:, :seq]) < thr))
        carry["prev"] = put(carry["prev"], jnp.where(skip, prev, (h1 - h).astype(prev.dtype)))
        return skip, h1, 1, (acc, ratio, run), carry
    if policy.method == "teacache":
        cur = (ctx.mod if policy.teacache_input == "modulation" else ctx.temb).astype(jnp.float32)
        rel = rel_l1(cur, get(carry["prev"]))
        cand = acc + jnp.polyval(tables["poly"], jnp.where(jnp.isfinite(rel), rel, 0.0))
        skip = jnp.logical_and(~force, jnp.all(cand < thr))
        acc = jnp.where(skip, cand, 0.0)
        carry["prev"] = put(carry["prev"], cur)
        return skip, h, 0, (acc, ratio, run), carry
    if policy.method == "magcache":
        r_cand = ratio * tables["mag"][i, rows]
        run_cand = run + 1
        err_cand = acc + jnp.abs(1.0 - r_cand)
        ok = jnp.logical_and(err_cand < thr, run_cand <= tables["max_skip"])
        skip = jnp.logical_and(~force, jnp.all(ok))
        acc = jnp.where(skip, err_cand, 0.0)
        ratio = jnp.where(skip, r_cand, 1.0)
        run = jnp.where(skip, run_cand, 0)
        return skip, h, 0, (acc, ratio, run), carry
    return jnp.bool_(False), h, 0, (acc, ratio, run), carry   # CFG reuse only, or CALIBRATE


def measure(ctx, out, residual, cached, carry: dict, i, rows: slice) -> dict:
    """Calibration: record this step's changes since the previous step (``m_*`` of
    :mod:`.carry`; 1.0 at step 0) and keep what the next step compares with."""
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
    denoiser on branches ``rows`` (``x [b, C_in, ...]``, timestep ``[b]`` or ``[b, L]``, text
    ``[b, T, Dt]``, the family's extra inputs) → ``(output [b, C, ...], carry)``, through the
    protocol of :class:`~ditax.models.base.Denoiser` (``embed`` / ``run_blocks`` / ``head``).

    The model is merged from ``params`` inside each ``lax.cond`` branch that runs blocks (NNX
    modules do not cross into a branch's trace; the parameters go in as an operand)."""
    def forward(x, tb, text, extras, rows, carry):
        model = nnx.merge(gdef, params)
        h, ctx = model.embed(x, tb, text, **extras)
        carry = dict(carry)
        start = h                                    # the tokens the cached residual adds to
        skip, h, first, (acc, ratio, run), carry = decide(policy, tables, model, h, ctx, carry,
                                                          i, rows)
        start = h if policy.method == "first_block" else start
        cached = carry["residual"][rows]
        if policy.method in METHODS:
            def compute(ops):
                p, h = ops
                out = nnx.merge(gdef, p).run_blocks(h, ctx, first, num_blocks(model))
                return out, (out - h).astype(cached.dtype)

            def reuse(ops):
                h = ops[1]
                return ((h.astype(jnp.float32) + cached.astype(jnp.float32)).astype(h.dtype),
                        cached)

            h, residual = jax.lax.cond(skip, reuse, compute, (params, h))
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
            carry = dict(carry, per_step=carry["per_step"].at[i, UNCOND].set(REUSED))
            return cond, uncond, carry

        if policy.cfg_cache:
            cond, uncond, carry = jax.lax.cond(tables["cfg_reuse"][i], cond_only, both,
                                               (params, carry))
        else:
            cond, uncond, carry = both((params, carry))
        v = guide(cond, uncond, guidance)
    new, sched_state = scheduler_update(scheduler, sched_state, v, latents)
    return new, sched_state, constrain_carry(carry, model.mesh)


__all__ = ["cached_denoise_step", "cached_forward", "decide", "measure", "rel_l1"]
