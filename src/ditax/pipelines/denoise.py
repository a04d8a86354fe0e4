"""The pipeline's denoise step, and the parts of it that the step-cached step shares.

One sampling step is: the transformer's inputs at this step's timestep (the image condition
folded in, :func:`step_inputs`), the transformer on the conditional and (with guidance) the
unconditional text (:func:`cfg_branches`: both in one batch-2 forward or one after the other),
classifier-free guidance (:func:`guide`) and the scheduler update (:func:`scheduler_update`).
:func:`_denoise_step` is that step, jitted; the step-cached step
(:mod:`.cached_step`) is the same step with a transformer forward that may reuse a cached
residual, built from the same parts.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.pipelines.wan.conditioning import batch_twice, model_inputs

COND, UNCOND, BOTH = slice(0, 1), slice(1, 2), slice(0, 2)   # rows of the CFG branches


def step_inputs(model, sched_state, latents, condition):
    """This step's timestep ``t`` (float32 ``[]``) and the transformer's inputs ``(x [B, C_in,
    F, Y, X] in the model dtype, timestep [B] or per token [B, L], image features or None)``
    (:func:`~ditax.pipelines.wan.conditioning.model_inputs`)."""
    t = sched_state.timesteps[sched_state.step_index].astype(jnp.float32)
    return t, model_inputs(condition, latents, t, jnp.dtype(model.cfg.dtype))


# forward(x, timestep, text, image, rows, carry) -> (output, carry): the transformer on the CFG
# branches ``rows`` (COND, UNCOND or BOTH); ``carry`` is threaded through (the step cache's
# state; None for the plain step)
Forward = Callable


def cond_branch(forward: Forward, inputs, text, carry=None):
    """The conditional branch alone: ``(cond [B, C, F, Y, X], carry)``."""
    x, tb, image = inputs
    return forward(x, tb, text[:x.shape[0]], image, COND, carry)


def cfg_branches(forward: Forward, cfg_mode: str, inputs, text, carry=None):
    """Both CFG branches, ``(cond, uncond, carry)``: ``"batched"`` stacks them in one batch-2
    forward (text ``[2, T, Dt]`` = cond, uncond), ``"sequential"`` runs them one by one."""
    x, tb, image = inputs
    b = x.shape[0]
    if cfg_mode == "batched":
        out, carry = forward(jnp.concatenate([x, x]), jnp.concatenate([tb, tb]), text,
                             batch_twice(image), BOTH, carry)
        return out[:b], out[b:], carry
    cond, carry = forward(x, tb, text[:b], image, COND, carry)
    uncond, carry = forward(x, tb, text[b:], image, UNCOND, carry)
    return cond, uncond, carry


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
    """The plain :data:`Forward` of ``model`` (the whole transformer; no carry)."""
    def forward(x, tb, text, image, rows, carry):
        return model(x, tb, text, encoder_hidden_states_image=image), carry
    return forward


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _denoise_step(gdef, scheduler, cfg_mode: str, use_cfg: bool, params, sched_state, latents,
                  text, guidance, condition=None):
    """One sampling step: transformer forward(s), guidance, scheduler update.

    ``gdef``/``scheduler``/modes are static (hashable; equal for both Wan 2.2 experts and for
    every pipeline with the same shapes), everything else traced: the step index is inside
    ``sched_state``, so one compiled program serves every step.
    latents float32 ``[1, C, F, Y, X]``; text ``[2, T, Dt]`` (cond, uncond) with guidance, else
    ``[1, T, Dt]``; guidance float32 ``[]``; ``condition`` an image's
    :class:`~ditax.pipelines.wan.conditioning.Condition` (None: text-to-video).
    Returns ``(latents, sched_state)``.
    """
    model = nnx.merge(gdef, params)
    _, inputs = step_inputs(model, sched_state, latents, condition)
    forward = model_forward(model)
    if not use_cfg:
        v, _ = cond_branch(forward, inputs, text)
    else:
        cond, uncond, _ = cfg_branches(forward, cfg_mode, inputs, text)
        v = guide(cond, uncond, guidance)
    return scheduler_update(scheduler, sched_state, v, latents)


__all__ = ["BOTH", "COND", "UNCOND", "cfg_branches", "cond_branch", "guide", "model_forward",
           "scheduler_update", "step_inputs"]
