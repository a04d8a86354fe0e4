"""Wan's rule for the denoiser's inputs at a sampling step (the
:class:`~ditax.models.base.ModelInputs` the generic loop, :mod:`ditax.pipelines.sampling`,
hands the compiled step): the image condition folded in by
:func:`~ditax.pipelines.wan.conditioning.model_inputs`, the CLIP features as the transformer's
``encoder_hidden_states_image`` keyword."""

from __future__ import annotations

import jax.numpy as jnp

from ditax.pipelines.wan.conditioning import model_inputs


def wan_inputs(model, condition, latents, t):
    """``(x [B, C_in, F, Y, X] in the model dtype, timestep [B] or per token [B, L],
    {"encoder_hidden_states_image": CLIP features or None})`` of ``latents`` at ``t``."""
    x, timestep, image = model_inputs(condition, latents, t, jnp.dtype(model.cfg.dtype))
    return x, timestep, {"encoder_hidden_states_image": image}


__all__ = ["wan_inputs"]
