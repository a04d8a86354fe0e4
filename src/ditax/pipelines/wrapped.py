"""A family's transformer behind the denoiser protocol of the generic loop
(:class:`~ditax.models.base.Denoiser`): what the FLUX.1, FLUX.2 and LTX-2 denoisers share.

The loop calls a denoiser ``(x, timestep, text, **extras)`` and keeps its latents replicated
over the mesh; a family's denoiser (``pipelines/<family>/denoiser.py``) lays its own
transformer's call out that way. :class:`WrappedTransformer` holds that transformer and hands on
what the loop and the step cache read of it (``cfg``, ``mesh``, ``block_stacks``);
:func:`timestep_thousandths` is the step-input rule of the families whose transformer takes
diffusers' ``t / 1000``.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx


class WrappedTransformer(nnx.Module):
    """The base of a family's denoiser: ``transformer`` (its loaded module) and the attributes
    the loop reads of it."""

    def __init__(self, transformer):
        self.transformer = transformer
        self.cfg = transformer.cfg

    @property
    def mesh(self):
        return self.transformer.mesh

    @property
    def block_stacks(self):
        return self.transformer.block_stacks

    def replicated(self, out):
        """A prediction replicated over the mesh, as the loop keeps its latents (a head leaves
        it split over the sequence shards; the step program's carry must keep one sharding
        from step to step)."""
        return self.transformer.sharding.constrain(out, (None,) * out.ndim)


def timestep_thousandths(model, condition, latents, t):
    """``(x [B, L, C_in] in the model dtype, timestep [B] = t / 1000, extras)`` at scheduler
    timestep ``t`` (0..1000; diffusers' FLUX pipelines divide by 1000 in the latents' float32);
    the extras are the request's ``condition`` dict (position ids, embedded guidance, ...)."""
    x = latents.astype(jnp.dtype(model.cfg.dtype))
    timestep = jnp.full((latents.shape[0],), t, jnp.float32) / jnp.float32(1000)
    return x, timestep, dict(condition)


__all__ = ["WrappedTransformer", "timestep_thousandths"]
