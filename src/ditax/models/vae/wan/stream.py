"""Streaming decode of the Wan VAE (issue 59): latent chunks decoded as they arrive.

The decoder is causal in time with a feature cache (:mod:`.chunks`), so a video's latents
can be decoded in the pieces a causal sampler makes them: the first latent frame alone (one
output frame), every later latent frame ``temporal_factor`` frames, the cache carried from
piece to piece. The frames of all pieces together are :meth:`WanVAE.decode`'s of the whole
latents, whatever the split.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.models.vae.wan.chunks import decode_chunk, device_of, resolve_path
from ditax.models.vae.wan.shuffle import video_pixels


class StreamDecoder:
    """``decoder(z)`` → frames ``[B, 3, f, H, W]`` in [-1, 1] for the next latent piece ``z
    [B, z_dim, n, Y, X]`` (raw VAE latents: :meth:`~WanVAE.denormalize_latents` first);
    ``f = 1 + temporal_factor·(n - 1)`` for the video's first piece, ``temporal_factor·n``
    after it. ``path``: the decoder's (:func:`~ditax.models.vae.wan.chunks.decode_chunk`).

    Programs: the first frame's, and one per later piece length (a causal sampler's chunks:
    the first chunk's ``n - 1`` and ``n``), compiled once and reused.
    """

    def __init__(self, vae, path: str = "auto"):
        self.vae = vae
        self.graphdef, self.state = nnx.split(vae)
        # "auto" made concrete where the parameters are (a CPU mesh on a TPU host decodes plain)
        self.path = resolve_path(path, device_of(jax.tree.leaves(self.state)[0]))
        self.cache = None
        self.frames = 0      # latent frames decoded so far

    def __call__(self, z) -> jax.Array:
        vae = self.vae
        vae._check_latents(z)
        x = jnp.transpose(jnp.asarray(z, vae.dtype), (0, 2, 3, 4, 1))   # [B, n, Y, X, z]
        outs = []
        if self.cache is None:
            out, self.cache = decode_chunk(self.graphdef, self.state, x[:, :1], None,
                                           first=True, path=self.path)
            outs.append(out)
            x = x[:, 1:]
        if x.shape[1]:
            out, self.cache = decode_chunk(self.graphdef, self.state, x, self.cache,
                                           first=False, path=self.path)
            outs.append(out)
        self.frames += z.shape[2]
        return video_pixels(jnp.concatenate(outs, axis=1), vae.config.patch_size or 1)


__all__ = ["StreamDecoder"]
