"""LTX-2's conditioning embedders: ``LTX2AdaLayerNormSingle`` (a timestep → its embedding and
``n`` modulation vectors) and the modulation arithmetic the blocks and the head share.

Module and parameter names mirror diffusers' so that conversion is a table (DESIGN rule 7):
``time_embed.emb.timestep_embedder.linear_1`` … ``time_embed.linear``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.nn import Linear, TimestepEmbedding, timestep_embedding

FREQ_DIM = 256   # sinusoid width of every timestep embedding (fixed in diffusers)


class TimestepEmbed(nnx.Module):
    """diffusers' ``PixArtAlphaCombinedTimestepSizeEmbeddings`` without size conditions (as
    LTX-2 builds it): ``timestep_embedder(sin/cos(t))``."""

    def __init__(self, dim: int, *, dtype, param_dtype, rngs):
        self.timestep_embedder = TimestepEmbedding(FREQ_DIM, dim, dtype=dtype,
                                                   param_dtype=param_dtype, rngs=rngs)

    def __call__(self, t, dtype):
        return self.timestep_embedder(timestep_embedding(t, FREQ_DIM).astype(dtype))


class AdaLNSingle(nnx.Module):
    """diffusers' ``LTX2AdaLayerNormSingle``: timesteps ``[B, T]`` → ``(linear(SiLU(e)) [B, T,
    n·D], e [B, T, D])`` in the compute dtype, ``e`` the timestep embedding (``T``: one
    timestep per sample, or one per token)."""

    def __init__(self, dim: int, n: int, *, dtype, param_dtype, rngs):
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.emb = TimestepEmbed(dim, **kw)
        self.linear = Linear(dim, n * dim, **kw)
        self.n = n

    def __call__(self, t):
        """``t [B, T]`` float32 → (modulation ``[B, T, n·D]``, embedding ``[B, T, D]``)."""
        b, tt = t.shape
        e = self.emb(t.reshape(-1), self.linear.dtype)
        return (self.linear(jax.nn.silu(e)).reshape(b, tt, -1), e.reshape(b, tt, -1))


def mod_terms(table, mod, n: int | None = None) -> list:
    """diffusers' ``get_mod_params``: ``table [n, D]`` plus ``mod [B, T, n·D]`` split into
    ``n`` float32 terms ``[B, T, D]`` (``T``: 1, or per token)."""
    n = table.shape[0] if n is None else n
    b, t = mod.shape[:2]
    full = table.astype(jnp.float32) + mod.astype(jnp.float32).reshape(b, t, n, -1)
    return [full[:, :, i] for i in range(n)]


def modulate(x, shift, scale):
    """``x · (1 + scale) + shift`` in float32 (``x`` a float32 normalised input)."""
    return x * (1 + scale) + shift


__all__ = ["AdaLNSingle", "TimestepEmbed", "mod_terms", "modulate", "FREQ_DIM"]
