"""The generic denoise step, and the parts of it that the step-cached step shares.

One sampling step is: the denoiser's inputs at this step's timestep (the family's
:class:`~ditax.models.base.ModelInputs` rule folds its condition in, :func:`step_inputs`), the
denoiser on the conditional and (with guidance) the unconditional text (:func:`cfg_branches`:
both in one batch-2 forward or one after the other; a family whose unconditional branch also
drops a non-text input says how with its rule's ``uncond``, :func:`uncond_rule`),
classifier-free guidance (:func:`guide`, or the family's own rule: :func:`guide_rule`) and the
scheduler update (:func:`scheduler_update`).
:func:`_denoise_step` is that step, jitted; the step-cached step
(:mod:`ditax.pipelines.cache.cached_step`) is the same step with a forward that may reuse a
cached residual, built from the same parts. Nothing here knows a family: the denoiser is
reached through the protocol of :mod:`ditax.models.base` (:class:`~ditax.models.base.Denoiser`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

COND, UNCOND, BOTH = slice(0, 1), slice(1, 2), slice(0, 2)   # rows of the CFG branches
# a step's outputs (latents, scheduler state) are its next call's arguments 2 and 1 (the
# ``carry`` of :meth:`~ditax.pipelines.programs.Programs.step`: laid out as they came in)
CARRY = (2, 1)


def step_inputs(model, inputs, sched_state, latents, condition):
    """This step's timestep ``t`` (float32 ``[]``) and the denoiser's inputs ``(x [B, C_in,
    ...] in the model dtype, timestep [B] or per token [B, L], extras: dict of keyword
    arguments)`` by the family's rule ``inputs(model, condition, latents, t)``."""
    t = sched_state.timesteps[sched_state.step_index].astype(jnp.float32)
    return t, inputs(model, condition, latents, t)


def batch_twice(inputs):
    """The inputs of a forward of (cond, uncond) stacked on the batch: every array twice
    along axis 0 (image features of first-last pairs stay adjacent)."""
    return jax.tree.map(lambda a: jnp.concatenate([a, a]), inputs)


def uncond_rule(inputs):
    """The family's rule for the unconditional branch's extras: ``inputs.uncond(extras) ->
    extras`` (an optional attribute of its :class:`~ditax.models.base.ModelInputs` rule; Wan
    Animate's blanks the face crops, as diffusers' ``WanAnimatePipeline``), or None: both
    branches take the same extras and differ by their text only."""
    return getattr(inputs, "uncond", None)


# forward(x, timestep, text, extras, rows, carry) -> (output, carry): the denoiser on the CFG
# branches ``rows`` (COND, UNCOND or BOTH); ``carry`` is threaded through (the step cache's
# state; None for the plain step)
Forward = Callable


def text_rows(text, rows: slice):
    """Rows ``rows`` of the text: an array, or a pytree of per-prompt arrays (Flux: the T5
    embeddings and the pooled CLIP vector), each sliced on its batch axis."""
    return jax.tree.map(lambda a: a[rows], text)


def cond_branch(forward: Forward, inputs, text, carry=None):
    """The conditional branch alone: ``(cond [B, C, ...], carry)``."""
    x, tb, extras = inputs
    return forward(x, tb, text_rows(text, slice(0, x.shape[0])), extras, COND, carry)


def cfg_branches(forward: Forward, cfg_mode: str, inputs, text, carry=None, uncond=None):
    """Both CFG branches, ``(cond, uncond, carry)``: ``"batched"`` stacks them in one batch-2
    forward (text ``[2, T, Dt]`` = cond, uncond), ``"sequential"`` runs them one by one.
    ``uncond``: the unconditional branch's extras from the conditional's (:func:`uncond_rule`;
    None: the same)."""
    x, tb, extras = inputs
    b = x.shape[0]
    extras_u = extras if uncond is None else uncond(extras)
    if cfg_mode == "batched":
        x2, tb2 = batch_twice((x, tb))
        extras2 = jax.tree.map(lambda a, u: jnp.concatenate([a, u]), extras, extras_u)
        out, carry = forward(x2, tb2, text, extras2, BOTH, carry)
        return out[:b], out[b:], carry
    cond, carry = forward(x, tb, text_rows(text, slice(0, b)), extras, COND, carry)
    uncond_out, carry = forward(x, tb, text_rows(text, slice(b, None)), extras_u, UNCOND,
                                carry)
    return cond, uncond_out, carry


def guide_rule(inputs):
    """The family's own guidance, ``inputs.guide(model, step_in, text, cond, uncond, guidance)
    -> v`` (an optional attribute of its :class:`~ditax.models.base.ModelInputs` rule: LTX-2's
    guides in the clean-sample space, per modality, with rescaling and further branches of its
    own, calling ``model`` again on the conditional rows), or None: :func:`guide`. It sees the
    branches' outputs (``uncond`` None without CFG), this step's inputs ``(x, timestep,
    extras)`` and the text of both branches."""
    return getattr(inputs, "guide", None)


def guide(cond, uncond, guidance):
    """Classifier-free guidance: ``uncond + g (cond - uncond)`` in the output dtype."""
    return uncond + guidance.astype(cond.dtype) * (cond - uncond)


def scheduler_update(scheduler, sched_state, v, latents):
    """One scheduler step with velocity ``v``; the new latents keep ``latents``' dtype (the
    Euler step returns the model dtype, as the reference; a float32 carry keeps the step's
    signature, and so its compiled program, the same every step)."""
    new, sched_state = scheduler.step(sched_state, v, latents)
    return new.astype(latents.dtype), sched_state


def model_forward(model) -> Forward:
    """The plain :data:`Forward` of ``model`` (the whole denoiser; no carry)."""
    def forward(x, tb, text, extras, rows, carry):
        return model(x, tb, text, **extras), carry
    return forward


def velocity(model, inputs, cfg_mode: str, use_cfg: bool, step_in, text, guidance):
    """The denoiser's guided output at one step: the conditional branch alone, or both CFG
    branches (:func:`cfg_branches`, the family's ``uncond`` rule) and :func:`guide` with
    ``guidance`` (``[]``, or one per row shaped to broadcast over the output's rows)."""
    forward = model_forward(model)
    own = guide_rule(inputs)
    if not use_cfg:
        v, _ = cond_branch(forward, step_in, text)
        return v if own is None else own(model, step_in, text, v, None, guidance)
    cond, uncond, _ = cfg_branches(forward, cfg_mode, step_in, text, uncond=uncond_rule(inputs))
    if own is not None:
        return own(model, step_in, text, cond, uncond, guidance)
    return guide(cond, uncond, guidance)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4))
def _denoise_step(gdef, inputs, scheduler, cfg_mode: str, use_cfg: bool, params, sched_state,
                  latents, text, guidance, condition=None):
    """One sampling step: denoiser forward(s), guidance, scheduler update.

    ``gdef`` (the denoiser's graph), ``inputs`` (the family's
    :class:`~ditax.models.base.ModelInputs` rule), ``scheduler`` and the modes are static
    (hashable; equal for both experts of a two-expert pipeline and for every pipeline with the
    same shapes), everything else traced: the step index is inside ``sched_state``, so one
    compiled program serves every step.
    latents float32 ``[1, C, ...]``; text ``[2, T, Dt]`` (cond, uncond) with guidance, else
    ``[1, T, Dt]``; guidance float32 ``[]``; ``condition`` the family's condition pytree
    (None: text only). Returns ``(latents, sched_state)``.
    """
    model = nnx.merge(gdef, params)
    _, step_in = step_inputs(model, inputs, sched_state, latents, condition)
    v = velocity(model, inputs, cfg_mode, use_cfg, step_in, text, guidance)
    return scheduler_update(scheduler, sched_state, v, latents)


__all__ = ["BOTH", "CARRY", "COND", "UNCOND", "batch_twice", "cfg_branches", "cond_branch",
           "guide", "guide_rule", "model_forward", "scheduler_update", "step_inputs",
           "text_rows", "uncond_rule", "velocity"]
