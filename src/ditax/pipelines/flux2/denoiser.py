"""FLUX.2's transformer as the generic sampling loop calls a denoiser
(:class:`~ditax.models.base.Denoiser`), and its rule for the step's inputs
(:class:`~ditax.models.base.ModelInputs`).

The loop hands a denoiser ``(x, timestep, text, **extras)`` and steps only ``x``. With
reference images (image-conditioned generation) diffusers appends their clean packed latents
to the noisy tokens on every step and keeps only the first ``L`` tokens of the prediction, so
here the references are an extra (``ref [B, R, C]`` with their ids ``ref_ids [B, R, 4]``): the
denoiser concatenates them after ``x`` and cuts the prediction back to ``x``'s tokens, and the
loop never sees them. Every extra carries a leading batch axis (the loop stacks them for a
batched CFG forward and :mod:`ditax.pipelines.batch` for a batch of requests); the ids of the
first row are the ids of every row.

Only the whole forward is offered: the family declares no step caching (whose ``embed`` /
``run_blocks`` / ``head`` split would have to carry the reference tokens through the cache).
"""

from __future__ import annotations

import jax.numpy as jnp

from ditax.pipelines.wrapped import WrappedTransformer, timestep_thousandths


class Flux2Denoiser(WrappedTransformer):
    """:class:`~ditax.models.flux2.transformer.Flux2Transformer` behind the denoiser protocol:
    ``x [B, L, C_in]`` packed tokens, ``timestep [B]`` (diffusers' ``t / 1000``), ``text [B, T,
    D_joint]``; extras ``img_ids [B, L, 4]``, ``txt_ids [B, T, 4]``, ``guidance [B]`` or None
    (dev's embedded guidance), ``ref [B, R, C_in]`` and ``ref_ids [B, R, 4]`` or None (no
    reference images)."""

    def __call__(self, x, timestep, text, *, img_ids, txt_ids, guidance=None, ref=None,
                 ref_ids=None):
        n = x.shape[1]
        if ref is not None:
            x = jnp.concatenate([x, ref.astype(x.dtype)], axis=1)
            img_ids = jnp.concatenate([img_ids, ref_ids], axis=1)
        out = self.transformer(x, text, timestep, img_ids[0], txt_ids[0], guidance)
        if ref is not None:
            out = out[:, :n]
        return self.replicated(out)


#: the step's inputs (:func:`~ditax.pipelines.wrapped.timestep_thousandths`): ``condition`` is
#: ``{"img_ids", "txt_ids", "guidance", "ref", "ref_ids"}`` of the request
flux2_inputs = timestep_thousandths


__all__ = ["Flux2Denoiser", "flux2_inputs"]
