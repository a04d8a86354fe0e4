"""Streaming a Wan pipeline's video chunk by chunk (issue 59): ``stream(pipe, prompt, ...)``
yields decoded frames per chunk of latent frames while the rest is being made.

The pipeline's parts: its text encoder (the prompt once, cond and uncond rows with
guidance), its transformer run causally (:class:`~ditax.pipelines.causal.CausalSampler`
with Wan's KV cache, :mod:`ditax.models.wan.kv_cache`), its VAE decoding each chunk as it
comes (:class:`~ditax.models.vae.wan.stream.StreamDecoder`: the causal feature cache carried,
so the frames of all chunks are the whole decode's). The first chunk's latent frames decode to
``1 + 4 (K - 1)`` frames, every later chunk's to ``4 K``.
"""

from __future__ import annotations

from typing import Iterator, Optional

import jax.numpy as jnp
import numpy as np

from ditax.errors import RequestError
from ditax.models.vae.wan.stream import StreamDecoder
from ditax.models.wan import kv_cache
from ditax.pipelines.base import channels_last, to_unit
from ditax.pipelines.causal import CausalSampler
from ditax.pipelines.wan.request import check_grid, check_request


def stream(pipe, prompt: str, *, chunk: int, height: int, width: int, num_frames: int,
           num_inference_steps: int = 4, sigmas=None, guidance_scale: float = 1.0,
           negative_prompt: Optional[str] = None, context_chunks: Optional[int] = None,
           seed: int = 0, latents=None) -> Iterator[np.ndarray]:
    """Yield float32 frames ``[f, H, W, 3]`` in [0, 1], one array per chunk of ``chunk``
    latent frames (``model.causal_chunk``), for a ``num_frames``-frame video of a loaded
    Wan text-to-video ``pipe`` whose transformer is a causal student.

    ``context_chunks`` (``sample.context_chunks``): chunks the KV cache keeps beside the
    sink (None: all); ``sigmas``: the few-step schedule (the Euler sampler); ``latents``: the
    start noise ``[1, C, F', Y, X]`` (else ``seed``'s). ``pipe.last_stats`` after the stream
    ends: the sampler's (chunks, transformer calls, cache shape / bytes, first chunk seconds).
    """
    if getattr(pipe, "transformer_2", None) is not None:
        raise RequestError("stream(): a two-expert (Wan 2.2 A14B) pipeline has no causal "
                           "student; load the causal student's folder")
    tr = pipe.transformer
    if tr.config.image_condition != "none" or tr.config.vace_layers:
        raise RequestError(f"stream(): {type(pipe).__name__} conditions on images / control "
                           f"video, which causal sampling does not take yet; stream from a "
                           f"text-to-video causal student")
    sf = pipe.vae.scale_factor_spatial * tr.config.patch_size[1]
    check_request(prompt, height, width, num_frames, num_inference_steps, guidance_scale,
                  None, negative_prompt, spatial=sf, temporal=pipe.vae.scale_factor_temporal,
                  seed=seed)
    check_grid(height, width, num_frames, tr.config.rope_max_seq_len, sf,
               pipe.vae.scale_factor_temporal, tr.config.patch_size[0])
    _, _, frames, y, x = pipe.latent_shape(height, width, num_frames)
    text = pipe.encode_text(prompt, negative_prompt, guidance_scale > 1.0)
    sampler = CausalSampler(tr.module, kv_cache, pipe.scheduler, chunk, context_chunks)
    decoder = StreamDecoder(pipe.vae)
    chunks = sampler.stream(text, num_frames=frames, latent_hw=(y, x),
                            num_inference_steps=num_inference_steps, sigmas=sigmas,
                            guidance_scale=guidance_scale, seed=seed, latents=latents)
    for z in chunks:
        pixels = decoder(pipe.vae.denormalize_latents(jnp.asarray(z, pipe.vae.dtype)))
        pipe.last_stats = dict(sampler.last_stats)
        yield to_unit(channels_last(pixels))


__all__ = ["stream"]
