"""One chunk of the Wan VAE's streaming encode / decode, as jitted pure functions.

``encode_chunk`` / ``decode_chunk`` are functions of ``(graphdef, state, chunk, cache)``,
compiled once per (chunk shape, ``first``) and reused for every chunk of every video of that
shape: ``graphdef`` is static (hashable), the feature cache is an ordinary pytree argument and is
donated, so the new cache can reuse its buffers (peak memory: one cache, not two). Chunks are
channels-last: encoder input ``[B, f, H, W, 3]`` (the first frame, then ``temporal_factor``
frames at a time), decoder input ``[B, 1, Y, X, z_dim]`` (one latent frame at a time).
The compiled objects are public so that benchmarks can ``lower(...).compile()`` them;
:func:`compile_decode` compiles the decoder's two programs ahead of time for one latent shape.
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


def compile_decode(graphdef, state, z) -> tuple:
    """Ahead-of-time ``decode_chunk`` programs for channels-last latents ``z`` ``[B, F, Y, X,
    z_dim]`` (an array or ``jax.ShapeDtypeStruct``; its sharding, if any, is the chunks'):
    ``(first, rest)``, each called as ``program(state, chunk, cache)`` like the jitted function
    without its static arguments; ``rest`` is None for one latent frame. The same programs the
    jitted calls compile, so results are identical."""
    chunk = jax.ShapeDtypeStruct((z.shape[0], 1, *z.shape[2:]), z.dtype,
                                 sharding=getattr(z, "sharding", None))
    first = decode_chunk.lower(graphdef, state, chunk, None, first=True)
    if z.shape[1] == 1:
        return first.compile(), None
    cache = first.out_info[1]
    rest = decode_chunk.lower(graphdef, state, chunk, cache, first=False)
    return first.compile(), rest.compile()


__all__ = ["compile_decode", "decode_chunk", "encode_chunk"]
