"""Flux embeddings: ``time_text_embed`` (timestep, guidance and pooled text → the conditioning
vector every block modulates with) and the RoPE tables of position ids.

Module and parameter names mirror diffusers' ``FluxTransformer2DModel`` so that conversion is
a table (DESIGN rule 7). The layers are the shared ones of :mod:`ditax.nn`.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import nnx

from ditax.models.flux.config import ROPE_THETA
from ditax.nn import TimestepEmbedding, timestep_embedding

FREQ_DIM = 256   # sinusoid width of the timestep / guidance embedding (fixed in diffusers)


class TimeTextEmbed(nnx.Module):
    """``temb [B, D]`` = timestep_embedder(sin(t)) (+ guidance_embedder(sin(g))) +
    text_embedder(pooled) — diffusers' ``CombinedTimestep(Guidance)TextProjEmbeddings``.

    ``text_embedder`` is diffusers' ``PixArtAlphaTextProjection`` with SiLU: the same
    ``linear_1 → SiLU → linear_2`` as a :class:`~ditax.nn.TimestepEmbedding`.
    """

    def __init__(self, dim: int, pooled_dim: int, guidance: bool, *, dtype, param_dtype, rngs):
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.timestep_embedder = TimestepEmbedding(FREQ_DIM, dim, **kw)
        self.guidance_embedder = TimestepEmbedding(FREQ_DIM, dim, **kw) if guidance else None
        self.text_embedder = TimestepEmbedding(pooled_dim, dim, **kw)

    def __call__(self, timestep, pooled, guidance=None):
        """timestep, guidance ``[B]`` already ×1000 (diffusers' scale); pooled ``[B, Dp]``."""
        dt = pooled.dtype
        temb = self.timestep_embedder(timestep_embedding(timestep, FREQ_DIM).astype(dt))
        if self.guidance_embedder is not None:
            temb = temb + self.guidance_embedder(
                timestep_embedding(guidance, FREQ_DIM).astype(dt))
        return temb + self.text_embedder(pooled)


def rope_frequencies(axes_dims) -> np.ndarray:
    """Per rotation pair, its axis's frequency ``theta**(-2i/d)`` (float64, host), in table
    order: axis 0's pairs, then axis 1's, ... ``[K/2]``."""
    return np.concatenate([1.0 / ROPE_THETA ** (np.arange(0, d, 2, dtype=np.float64) / d)
                           for d in axes_dims])


def rope_cos_sin(ids, axes_dims):
    """(cos, sin) ``[S, K]`` float32 of position ids ``[S, n_axes]`` (diffusers'
    ``FluxPosEmbed``: axis ``a`` rotates its ``axes_dims[a]`` channels by ``id[a] · freq``,
    each pair's value on both of its channels — the tables :func:`~ditax.nn.apply_rope`
    takes).

    The ids are an input of the model (traced under jit), so the angles are float32 products
    of float32 ids and frequencies (diffusers multiplies in float64 and rounds cos / sin to
    float32): the angle differs by at most ``|id| · 2⁻²³`` radians — 1.5e-5 at FLUX's largest
    positions (128 at 2048²), 1e-6 for the ids of the tests.
    """
    axes = tuple(int(d) for d in axes_dims)
    pair_axis = np.repeat(np.arange(len(axes)), [d // 2 for d in axes])      # [K/2]
    freqs = jnp.asarray(rope_frequencies(axes), jnp.float32)
    pos = jnp.asarray(ids, jnp.float32)[:, pair_axis]                         # [S, K/2]
    angles = jnp.repeat(pos * freqs, 2, axis=-1)                              # [S, K]
    return jnp.cos(angles), jnp.sin(angles)


__all__ = ["TimeTextEmbed", "rope_cos_sin", "rope_frequencies", "FREQ_DIM"]
