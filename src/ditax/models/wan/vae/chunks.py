"""One chunk of the Wan VAE's streaming encode / decode, as jitted pure functions.

``encode_chunk`` / ``decode_chunk`` are functions of ``(graphdef, state, chunk, cache)``,
compiled once per (chunk shape, ``first``) and reused for every chunk of every video of that
shape: ``graphdef`` is static (hashable), the feature cache is an ordinary pytree argument and is
donated, so the new cache can reuse its buffers (peak memory: one cache, not two). Chunks are
channels-last: encoder input ``[B, f, H, W, 3]`` (the first frame, then ``temporal_factor``
frames at a time), decoder input ``[B, 1, Y, X, z_dim]`` (one latent frame at a time).
The compiled objects are public so that benchmarks can ``lower(...).compile()`` them.
"""

from __future__ import annotations

import functools

import jax
from flax import nnx


@functools.partial(jax.jit, static_argnames=("graphdef", "first"), donate_argnames=("cache",))
def encode_chunk(graphdef, state, x, cache, *, first: bool):
    """Frames ``[B, f, H, W, 3]`` → (posterior moments ``[B, f', Y, X, 2 z_dim]``, new cache)."""
    vae = nnx.merge(graphdef, state)
    h, cache = vae.encoder(x, cache, first)
    return vae.quant_conv(h)[0], cache


@functools.partial(jax.jit, static_argnames=("graphdef", "first"), donate_argnames=("cache",))
def decode_chunk(graphdef, state, z, cache, *, first: bool):
    """Latent frame ``[B, 1, Y, X, z_dim]`` → (unclipped frames ``[B, f, H, W, 3]``, new cache);
    ``f`` is 1 for the first chunk and ``temporal_factor`` after it."""
    vae = nnx.merge(graphdef, state)
    x = vae.post_quant_conv(z)[0]
    return vae.decoder(x, cache, first)


__all__ = ["decode_chunk", "encode_chunk"]
