"""VACE's request in the pipeline: the condition pytree every step hands the transformer
(:class:`VaceCondition`), the denoiser's inputs and the latents to decode, the per-layer scales.
The control inputs' host rules and the control context (module docstring there) are
:mod:`ditax.models.wan.vace_context`'s, shared with ``ditax preprocess``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np

from ditax.errors import RequestError


@dataclass(frozen=True)
class VaceCondition:
    """One request's control: ``control`` ``[1, C_v, n + F', Y, X]`` (transformer dtype),
    ``scale`` ``[1, len(vace_layers)]`` float32, ``references`` = n (static)."""

    control: jax.Array
    scale: jax.Array
    references: int = field(default=0)


jax.tree_util.register_dataclass(VaceCondition, data_fields=["control", "scale"],
                                 meta_fields=["references"])


def vace_inputs(model, condition, latents, t):
    """The denoiser's inputs at ``t`` (:class:`~ditax.models.base.ModelInputs`): the latents in
    the model dtype, ``[B]`` timesteps and the control context / scales as keywords, with the
    condition's batch (doubled with the latents for a batched CFG forward)."""
    b = latents.shape[0]
    return (latents.astype(jnp.dtype(model.cfg.dtype)), jnp.full((b,), t),
            {"control_hidden_states": condition.control,
             "control_hidden_states_scale": condition.scale})


def vace_final(condition, latents):
    """The latents to decode: the reference frames dropped (diffusers drops them too)."""
    return latents[:, :, condition.references:]


def conditioning_scales(conditioning_scale, n: int) -> np.ndarray:
    """``[1, n]`` float32 from a number or ``n`` numbers (one per VACE layer)."""
    s = np.asarray(conditioning_scale, np.float64)
    if s.ndim == 0:
        s = np.full((n,), float(s))
    if s.ndim != 1 or s.shape[0] != n or not np.isfinite(s).all():
        raise RequestError(f"conditioning_scale={conditioning_scale!r} must be a finite number "
                           f"or {n} numbers (one per VACE layer)")
    return s.astype(np.float32)[None]


__all__ = ["VaceCondition", "conditioning_scales", "vace_final", "vace_inputs"]
