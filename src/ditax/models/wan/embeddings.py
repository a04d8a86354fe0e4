"""Wan embeddings: the condition embedder (timestep → modulation, text projection) and the
3-D RoPE tables.

Module and parameter names mirror diffusers' ``WanTransformer3DModel`` so that conversion is a
table (DESIGN rule 7). The layers themselves are the shared ones of :mod:`ditax.nn`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ditax.models.wan.image_embedder import ImageEmbedder
from ditax.nn import Linear, TextProjection, TimestepEmbedding, axial_rope_angles, \
    pair_tables, timestep_embedding


class ConditionEmbedder(nnx.Module):
    """Timestep → (temb ``[B, D]``, 6-way modulation ``[B, 6, D]``); text ``[B, T, Dt] → [B, T, D]``.

    Per-token timesteps ``[B, L]`` (Wan 2.2 TI2V, ``expand_timesteps``: the conditioning
    frame's tokens at t=0) give temb ``[B, L, D]`` and modulation ``[B, L, 6, D]``.

    With ``image_dim`` (image-to-video) it also holds ``image_embedder``
    (:class:`~ditax.models.wan.image_embedder.ImageEmbedder`), called by the transformer.
    """

    def __init__(self, dim, freq_dim, text_dim, *, dtype, param_dtype, rngs, image_dim=None,
                 pos_embed_seq_len=None):
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.freq_dim = freq_dim
        self.time_embedder = TimestepEmbedding(freq_dim, dim, **kw)
        self.time_proj = Linear(dim, 6 * dim, **kw)
        self.text_embedder = TextProjection(text_dim, dim, **kw)
        if image_dim is not None:
            self.image_embedder = ImageEmbedder(image_dim, dim, pos_embed_seq_len, **kw)
        else:
            self.image_embedder = None

    def __call__(self, timestep, text):
        lead = timestep.shape  # [B] or [B, L]
        t = timestep_embedding(timestep.reshape(-1), self.freq_dim)
        temb = self.time_embedder(t).astype(text.dtype)
        mod = self.time_proj(jax.nn.silu(temb))
        temb = temb.reshape(*lead, -1)
        mod = mod.reshape(*lead, 6, -1)
        return temb, mod, self.text_embedder(text)


# ----------------------------------------------------------------------------------------------
# 3-D rotary position embedding


def rope_split(head_dim: int) -> tuple[int, int, int]:
    """Head-dim split (frame, height, width) of Wan's 3-D RoPE: h = w = 2*(K//6), f = the rest."""
    hw = 2 * (head_dim // 6)
    return head_dim - 2 * hw, hw, hw


@functools.lru_cache(maxsize=64)
def rope_angles(head_dim: int, grid: tuple[int, int, int], theta: float = 10000.0,
                max_seq_len: int = 1024) -> np.ndarray:
    """Rotation angles ``[L, K/2]`` (float64, host) for a latent grid ``(F', Y', X')``.

    Token order is frame-major (f, y, x), matching the patch flattening.
    """
    if max(grid) > max_seq_len:
        raise ValueError(f"latent grid {grid} exceeds rope_max_seq_len={max_seq_len}")
    return axial_rope_angles(rope_split(head_dim), grid, theta)


def rope_cos_sin(head_dim: int, grid, max_seq_len: int = 1024):
    """(cos, sin) as float32 device constants ``[L, K]``, each pair's value on both of its
    channels (diffusers' ``freqs_cos`` / ``freqs_sin``; what :func:`~ditax.nn.apply_rope`
    takes)."""
    a = rope_angles(head_dim, tuple(int(g) for g in grid), 10000.0, max_seq_len)
    cos, sin = pair_tables(a)
    return jnp.asarray(cos), jnp.asarray(sin)
