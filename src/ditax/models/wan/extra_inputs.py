"""What the Wan variants with inputs of their own (VACE: the control context and its scales;
Animate: the pose latents and the face crops) share: those inputs as arrays, checked against
the latents (:func:`checked`) in the modules' ``embed`` before Wan's (:func:`checked_embed`)
and, with Wan's, in the loaded callable before it places them (:func:`checked_inputs`); and
that callable's jitted call (:data:`forward`)."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx


def arrays(*xs) -> tuple:
    """Each of ``xs`` as a jax array; None stays None."""
    return tuple(None if x is None else jnp.asarray(x) for x in xs)


def checked(check: Callable, latents, extra) -> tuple:
    """A variant's own inputs ``extra`` as :func:`arrays`, after ``check(latents, *extra)``
    (raises ValueError naming the shapes the model cannot take)."""
    extra = arrays(*extra)
    check(jnp.asarray(latents), *extra)
    return extra


def checked_embed(embed: Callable, check: Callable, extra, latents, *wan_inputs) -> tuple:
    """``(h, ctx, extra)``: a variant module's own inputs ``extra`` :func:`checked`, then
    Wan's ``embed(latents, *wan_inputs)`` (the variant's ``super().embed``)."""
    extra = checked(check, latents, extra)
    return (*embed(latents, *wan_inputs), extra)


def checked_inputs(module, check: Callable, extra, latents, timestep, text, text_mask=None,
                   image=None) -> tuple:
    """A loaded variant's call inputs, checked (Wan's by ``module.check_inputs``, its own
    ``extra`` by :func:`checked`): ``((latents, t, text, text_mask, image), extra)`` as
    arrays, ``t`` float32 ``[B]`` or per token ``[B, L]``, ``text_mask`` boolean."""
    latents, text, image = arrays(latents, text, image)
    module.check_inputs(latents, jnp.asarray(timestep), text, text_mask, image)
    extra = checked(check, latents, extra)
    t = jnp.asarray(timestep, jnp.float32)
    b = latents.shape[0]
    t = jnp.broadcast_to(t, (b,) + t.shape[1:] if t.ndim == 2 else (b,))
    mask = None if text_mask is None else jnp.asarray(text_mask, bool)
    return (latents, t, text, mask, image), extra


def _forward(gdef, state, *args):
    return nnx.merge(gdef, state)(*args)


forward = jax.jit(_forward, static_argnums=0)   # (graphdef, state, *call args) -> the module's call

__all__ = ["arrays", "checked", "checked_embed", "checked_inputs", "forward"]
