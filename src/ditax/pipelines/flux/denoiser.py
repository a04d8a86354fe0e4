"""FLUX.1's transformer as the generic sampling loop calls a denoiser
(:class:`~ditax.models.base.Denoiser`), and its rule for the step's inputs
(:class:`~ditax.models.base.ModelInputs`).

The loop hands a denoiser ``(x, timestep, text, **extras)`` and splits only ``text`` between
the guidance branches. Flux's pooled CLIP vector belongs to the prompt, so here ``text`` is the
pair ``(T5 embeddings [B, T, Dt], pooled [B, Dp])`` (cond and uncond rows with true CFG); the
extras (position ids, the embedded guidance scale) are the same for both branches and carry a
leading batch axis so the loop may stack them for a batched CFG forward: the ids of the first
row are the ids of every row.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx


class FluxDenoiser(nnx.Module):
    """:class:`~ditax.models.flux.transformer.FluxTransformer` behind the denoiser protocol:
    ``x [B, L, C_in]`` packed tokens, ``timestep [B]`` in [0, 1], ``text = (emb, pooled)``,
    extras ``img_ids [B, L, 3]``, ``txt_ids [B, T, 3]``, ``guidance [B]`` or None."""

    def __init__(self, transformer):
        self.transformer = transformer
        self.cfg = transformer.cfg

    @property
    def mesh(self):
        return self.transformer.mesh

    @property
    def block_stacks(self):
        return self.transformer.block_stacks

    def _kwargs(self, text, img_ids, txt_ids, guidance):
        emb, pooled = text
        return emb, dict(pooled_projections=pooled, img_ids=img_ids[0], txt_ids=txt_ids[0],
                         guidance=guidance)

    def _replicated(self, out):
        """The prediction replicated over the mesh, as the loop keeps its latents (the head
        leaves it split over the sequence shards; the step program's carry must keep one
        sharding from step to step)."""
        return self.transformer.sharding.constrain(out, (None,) * out.ndim)

    def __call__(self, x, timestep, text, *, img_ids, txt_ids, guidance=None):
        emb, kw = self._kwargs(text, img_ids, txt_ids, guidance)
        return self._replicated(self.transformer(x, timestep, emb, **kw))

    def embed(self, x, timestep, text, *, img_ids, txt_ids, guidance=None):
        emb, kw = self._kwargs(text, img_ids, txt_ids, guidance)
        return self.transformer.embed(x, timestep, emb, **kw)

    def run_blocks(self, h, ctx, start: int = 0, stop: int | None = None):
        return self.transformer.run_blocks(h, ctx, start, stop)

    def head(self, h, ctx):
        return self._replicated(self.transformer.head(h, ctx))


def flux_inputs(model, condition, latents, t):
    """``(x [1, L, C_in] in the model dtype, timestep [1] = t / 1000, extras)`` at scheduler
    timestep ``t`` (0..1000; diffusers' pipeline divides by 1000 in the latents' float32);
    ``condition``: ``{"img_ids", "txt_ids", "guidance"}`` of the request."""
    x = latents.astype(jnp.dtype(model.cfg.dtype))
    timestep = jnp.full((latents.shape[0],), t, jnp.float32) / jnp.float32(1000)
    return x, timestep, dict(condition)


__all__ = ["FluxDenoiser", "flux_inputs"]
