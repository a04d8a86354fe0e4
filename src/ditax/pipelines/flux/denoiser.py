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

from ditax.pipelines.wrapped import WrappedTransformer, timestep_thousandths


class FluxDenoiser(WrappedTransformer):
    """:class:`~ditax.models.flux.transformer.FluxTransformer` behind the denoiser protocol:
    ``x [B, L, C_in]`` packed tokens, ``timestep [B]`` in [0, 1], ``text = (emb, pooled)``,
    extras ``img_ids [B, L, 3]``, ``txt_ids [B, T, 3]``, ``guidance [B]`` or None."""

    def _kwargs(self, text, img_ids, txt_ids, guidance):
        emb, pooled = text
        return emb, dict(pooled_projections=pooled, img_ids=img_ids[0], txt_ids=txt_ids[0],
                         guidance=guidance)

    def __call__(self, x, timestep, text, *, img_ids, txt_ids, guidance=None):
        emb, kw = self._kwargs(text, img_ids, txt_ids, guidance)
        return self.replicated(self.transformer(x, timestep, emb, **kw))

    def embed(self, x, timestep, text, *, img_ids, txt_ids, guidance=None):
        emb, kw = self._kwargs(text, img_ids, txt_ids, guidance)
        return self.transformer.embed(x, timestep, emb, **kw)

    def run_blocks(self, h, ctx, start: int = 0, stop: int | None = None):
        return self.transformer.run_blocks(h, ctx, start, stop)

    def head(self, h, ctx):
        return self.replicated(self.transformer.head(h, ctx))


#: the step's inputs (:func:`~ditax.pipelines.wrapped.timestep_thousandths`): ``condition`` is
#: ``{"img_ids", "txt_ids", "guidance"}`` of the request
flux_inputs = timestep_thousandths


__all__ = ["FluxDenoiser", "flux_inputs"]
