"""LTX-2's guidance: in the clean-sample space, per modality, with rescaling and two optional
branches of its own.

diffusers' ``LTX2Pipeline`` guides each stream (video, audio) on its predicted clean sample
``x0 = x - sigma v`` rather than on the velocity, as a sum of deltas against the conditional
prediction ``c``:

    x0 = c + (g - 1) (c - u) + s (c - p) + (m - 1) (c - i)

with ``u`` the unconditional (negative prompt) branch and guidance scale ``g``; ``p`` the
spatio-temporal-guidance branch (the conditional forward with self-attention skipped in the
chosen blocks) and its scale ``s``; ``i`` the modality-isolation branch (the conditional
forward without the audio<->video cross-attention) and its scale ``m``. Each term is off at
its neutral scale (``g = 1``, ``s = 0``, ``m = 1``). Then ``rescale`` (``r > 0``) pulls the
guided sample's standard deviation back toward the conditional one's, per row,
``x0 <- r x0 std(c) / std(x0) + (1 - r) x0`` (standard deviations over all but the batch
axis, with Bessel's correction, as torch's ``std``), and the velocity the scheduler takes is
``(x - x0) / sigma``. Video and audio have their own scales.

Without the extra branches and rescaling this is ordinary CFG on the velocity (the ``x0`` maps
are affine), so it differs from :func:`ditax.pipelines.denoise.guide` only in rounding.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp


class Scales(NamedTuple):
    """One modality's guidance scales, each ``[B]`` float32 (or ``[]``): ``cfg`` (``g``),
    ``stg`` (``s``), ``modality`` (``m``), ``rescale`` (``r``)."""

    cfg: object
    stg: object
    modality: object
    rescale: object


def _rows(a, ndim: int):
    """``a`` (``[]`` or ``[B]``) shaped to broadcast over ``[B, ...]`` of rank ``ndim``."""
    a = jnp.asarray(a, jnp.float32)
    return a.reshape(a.shape + (1,) * (ndim - a.ndim)) if a.ndim else a


def rescale(guided, cond, r):
    """``r guided std(cond) / std(guided) + (1 - r) guided`` per row (diffusers'
    ``rescale_noise_cfg``; standard deviations over all but axis 0, unbiased)."""
    axes = tuple(range(1, guided.ndim))
    std_c = jnp.std(cond, axis=axes, keepdims=True, ddof=1)
    std_g = jnp.std(guided, axis=axes, keepdims=True, ddof=1)
    r = _rows(r, guided.ndim)
    return r * (guided * (std_c / std_g)) + (1.0 - r) * guided


def guided_velocity(x, sigma, cond, scales: Scales, uncond=None, perturbed=None,
                    isolated=None):
    """The guided velocity of one modality.

    ``x``: the step's input latents (float32, ``[B, ...]``); ``sigma``: ``[B]`` (or ``[]``)
    noise level; ``cond`` / ``uncond`` / ``perturbed`` / ``isolated``: the velocities of the
    conditional, unconditional, spatio-temporal-guidance and modality-isolation branches
    (None: that branch did not run, its term is off). All float32 ``[B, ...]``."""
    f32 = jnp.float32
    x = x.astype(f32)
    s = _rows(sigma, x.ndim)

    def x0(v):
        return x - v.astype(f32) * s

    c = x0(cond)
    out = c
    if uncond is not None:
        out = out + (_rows(scales.cfg, x.ndim) - 1.0) * (c - x0(uncond))
    if perturbed is not None:
        out = out + _rows(scales.stg, x.ndim) * (c - x0(perturbed))
    if isolated is not None:
        out = out + (_rows(scales.modality, x.ndim) - 1.0) * (c - x0(isolated))
    out = rescale(out, c, scales.rescale)
    return (x - out) / s


__all__ = ["Scales", "guided_velocity", "rescale"]
