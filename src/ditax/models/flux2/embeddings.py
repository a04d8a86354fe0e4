"""FLUX.2 embeddings: the timestep (+ guidance) embedding, the shared modulations every block
reads, and the RoPE tables of the 4-axis position ids.

Module and parameter names mirror diffusers' ``Flux2Transformer2DModel``
(``time_guidance_embed``, ``double_stream_modulation_img`` …) so that conversion is a table
(DESIGN rule 7). Unlike FLUX.1 there is no pooled text vector and no bias anywhere.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ditax.nn import Linear, timestep_embedding


class TimestepMLP(nnx.Module):
    """``linear_1 → SiLU → linear_2`` without biases (diffusers ``TimestepEmbedding`` with
    ``sample_proj_bias=False``)."""

    def __init__(self, din: int, dim: int, *, dtype, param_dtype, rngs):
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs, bias=False)
        self.linear_1 = Linear(din, dim, **kw)
        self.linear_2 = Linear(dim, dim, **kw)

    def __call__(self, x):
        return self.linear_2(jax.nn.silu(self.linear_1(x)))


class TimeGuidanceEmbed(nnx.Module):
    """``temb [B, D]`` = timestep_embedder(sin(t)) (+ guidance_embedder(sin(g)) when the
    model embeds guidance and ``g`` is given) — diffusers' ``Flux2TimestepGuidanceEmbeddings``
    (sinusoid: cos half first, no shift; ``freq`` channels)."""

    def __init__(self, freq: int, dim: int, guidance: bool, *, dtype, param_dtype, rngs):
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.freq = freq
        self.timestep_embedder = TimestepMLP(freq, dim, **kw)
        self.guidance_embedder = TimestepMLP(freq, dim, **kw) if guidance else None

    def __call__(self, timestep, guidance=None, dtype=jnp.float32):
        """timestep, guidance ``[B]`` already x1000 (diffusers' scale) → ``[B, D]``."""
        temb = self.timestep_embedder(timestep_embedding(timestep, self.freq).astype(dtype))
        if guidance is not None and self.guidance_embedder is not None:
            temb = temb + self.guidance_embedder(
                timestep_embedding(guidance, self.freq).astype(dtype))
        return temb


class Modulation(nnx.Module):
    """``linear(SiLU(temb))``: ``terms`` float32 modulation terms side by side — diffusers'
    ``Flux2Modulation`` (6 = shift, scale, gate of attention and MLP of a double block's
    stream; 3 = a single block's), computed once per forward and shared by every block of a
    kind; and the output norm's (2 = scale, shift of ``AdaLayerNormContinuous``)."""

    def __init__(self, dim: int, terms: int, *, dtype, param_dtype, rngs):
        self.linear = Linear(dim, terms * dim, dtype=dtype, param_dtype=param_dtype,
                             rngs=rngs, bias=False)

    def __call__(self, temb):
        """``[B, D]`` → ``[B, terms·D]`` float32 (split by :func:`mod_terms`)."""
        return self.linear(jax.nn.silu(temb)).astype(jnp.float32)


def mod_terms(mod, n: int) -> list:
    """``mod [B, n·D]`` → ``n`` terms ``[B, 1, D]``."""
    return [m[:, None, :] for m in jnp.split(mod, n, axis=-1)]


def rope_frequencies(axes_dims, theta: float) -> np.ndarray:
    """Per rotation pair, its axis's frequency ``theta**(-2i/d)`` (float64, host), in table
    order: axis 0's pairs, then axis 1's, ... ``[K/2]``."""
    return np.concatenate([1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
                           for d in axes_dims])


def rope_cos_sin(ids, axes_dims, theta: float):
    """(cos, sin) ``[S, K]`` float32 of position ids ``[S, n_axes]`` (diffusers'
    ``Flux2PosEmbed``: axis ``a`` rotates its ``axes_dims[a]`` channels by ``id[a] · freq``,
    each pair's value on both of its channels — the tables :func:`~ditax.nn.apply_rope`
    takes).

    The ids are a traced input, so the angles are float32 products (diffusers multiplies in
    float64 and rounds cos / sin to float32): the angle differs by at most ``|id| · 2⁻²³``
    radians — 6e-5 at a 512-token prompt's last text position, 6e-6 for the ids of the tests.
    """
    axes = tuple(int(d) for d in axes_dims)
    pair_axis = np.repeat(np.arange(len(axes)), [d // 2 for d in axes])      # [K/2]
    freqs = jnp.asarray(rope_frequencies(axes, theta), jnp.float32)
    pos = jnp.asarray(ids, jnp.float32)[:, pair_axis]                         # [S, K/2]
    angles = jnp.repeat(pos * freqs, 2, axis=-1)                              # [S, K]
    return jnp.cos(angles), jnp.sin(angles)


__all__ = ["TimestepMLP", "TimeGuidanceEmbed", "Modulation",
           "mod_terms", "rope_cos_sin", "rope_frequencies"]
