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
from ditax.pipelines.decode_fit import check_stream
from ditax.pipelines.wan.request import check_grid, check_request


def stream(pipe, prompt: str, *, height: int, width: int, num_frames: int,
           chunk: Optional[int] = None, num_inference_steps: int = 4, sigmas=None,
           guidance_scale: float = 1.0, negative_prompt: Optional[str] = None,
           context_chunks: Optional[int] = None, seed: int = 0, latents=None,
           max_sequence_length: Optional[int] = None,
           step_cache: Optional[dict] = None) -> Iterator[np.ndarray]:
    """Yield float32 frames ``[f, H, W, 3]`` in [0, 1], one array per chunk of ``chunk``
    latent frames (None: the transformer's ``model.causal_chunk``), for a
    ``num_frames``-frame video of a loaded Wan text-to-video ``pipe`` whose transformer is a
    causal student (``max_sequence_length``: text tokens, None: the pipeline's).

    ``context_chunks`` (``sample.context_chunks``): chunks the KV cache keeps beside the
    sink (None: all); ``sigmas``: the few-step schedule (the Euler sampler); ``latents``: the
    start noise ``[1, C, F', Y, X]`` (else ``seed``'s); ``step_cache``: step caching inside
    each chunk, ``{"cache", "cache_threshold", "cache_coefficients"}`` as the pipeline call
    takes them (:class:`~ditax.pipelines.causal.CausalSampler`). ``pipe.last_stats`` after
    the stream ends: the sampler's (chunks, transformer calls, cache shape / bytes, first
    chunk seconds, the steps skipped).
    """
    if getattr(pipe, "transformer_2", None) is not None:
        raise RequestError("stream(): a two-expert (Wan 2.2 A14B) pipeline has no causal "
                           "student; load the causal student's folder")
    tr = pipe.transformer
    if tr.config.image_condition != "none" or tr.config.vace_layers:
        raise RequestError(f"stream(): {type(pipe).__name__} conditions on images / control "
                           f"video, which causal sampling does not take yet; stream from a "
                           f"text-to-video causal student")
    chunk = tr.config.causal_chunk if chunk is None else chunk
    if chunk is None:
        raise RequestError("stream(): the transformer is bidirectional (no model.causal_chunk "
                           "in its config.json); pass chunk=K latent frames or load a causal "
                           "student's folder")
    sf = pipe.vae.scale_factor_spatial * tr.config.patch_size[1]
    check_request(prompt, height, width, num_frames, num_inference_steps, guidance_scale,
                  None, negative_prompt, spatial=sf, temporal=pipe.vae.scale_factor_temporal,
                  seed=seed)
    check_grid(height, width, num_frames, tr.config.rope_max_seq_len, sf,
               pipe.vae.scale_factor_temporal, tr.config.patch_size[0])
    _, _, frames, y, x = pipe.latent_shape(height, width, num_frames)
    # each piece decodes whole (no tiles): one line before any work where it cannot fit
    check_stream(pipe, (1, pipe.vae.z_dim, min(chunk, frames - 1) + 1, y, x))
    text = pipe.encode_text(prompt, negative_prompt, guidance_scale > 1.0, max_sequence_length)
    sampler = CausalSampler(tr.module, kv_cache, pipe.scheduler, chunk, context_chunks)
    decoder = StreamDecoder(pipe.vae)
    chunks = sampler.stream(text, num_frames=frames, latent_hw=(y, x),
                            num_inference_steps=num_inference_steps, sigmas=sigmas,
                            guidance_scale=guidance_scale, seed=seed, latents=latents,
                            **(step_cache or {}))
    for z in chunks:
        pixels = decoder(pipe.vae.denormalize_latents(jnp.asarray(z, pipe.vae.dtype)))
        pipe.last_stats = dict(sampler.last_stats)
        yield to_unit(channels_last(pixels))


def video(pipe, prompt, negative_prompt=None, height=None, width=None, num_frames=None,
          num_inference_steps=None, guidance_scale=None, seed: int = 0, latents=None, *,
          output: str = "video", sigmas=None, max_sequence_length=None, **options):
    """A causal student's whole video ``[F, H, W, 3]`` (float32, [0, 1]): :func:`stream`'s
    chunks joined — what ``pipe(prompt, ...)`` (so ``ditax generate`` and ``ditax serve``)
    runs on a folder whose transformer has ``causal_chunk``. Values left at None come from
    the folder's ``ditax_sample.json`` (``context_chunks`` too), else Wan's; ``options``:
    ``context_chunks``, ``on_chunk(index, frames_so_far, frames)`` (called as each chunk is
    decoded, ``frames`` its ``[f, H, W, 3]``: ``ditax serve``'s chunk events), ``frames_to``
    (each chunk's frames put there once checked finite: ``frames_to.put(frames)``, an
    :class:`~ditax.io.video_stream.Mp4Stream` encoding while the next chunk is made), step caching
    inside each chunk (``cache``, ``cache_threshold``, ``cache_coefficients``) and the
    pipeline call's others, each refused in one line when set (``cfg_cache``, images, a
    second expert's guidance: not in causal sampling)."""
    from ditax.pipelines.lora_sample import default_sigmas

    from ditax.pipelines.sampling import check_finite

    on_chunk, frames_to = options.pop("on_chunk", None), options.pop("frames_to", None)
    caching = {k: options.pop(k) for k in ("cache", "cache_threshold", "cache_coefficients")
               if options.get(k) is not None}
    given = [k for k, v in options.items() if k != "context_chunks" and v not in (None, False)]
    if given or output != "video":
        what = given[0] if given else f"output={output!r}"
        raise RequestError(f"{what} is not taken by a causal student ({type(pipe).__name__} "
                           f"with model.causal_chunk={pipe.transformer.config.causal_chunk}: "
                           f"chunk-by-chunk sampling); drop it")
    call = pipe.call_defaults(height=height, width=width, num_frames=num_frames,
                              num_inference_steps=num_inference_steps,
                              guidance_scale=guidance_scale, negative_prompt=negative_prompt,
                              context_chunks=options.get("context_chunks"))
    if sigmas is None:
        sigmas = default_sigmas(pipe.sample_defaults, call["num_inference_steps"])
    frames, made = [], 0
    for i, part in enumerate(stream(pipe, prompt, seed=seed, latents=latents, sigmas=sigmas,
                                    max_sequence_length=max_sequence_length,
                                    step_cache=caching, **call)):
        frames.append(np.asarray(part))
        made += part.shape[0]
        if on_chunk is not None:
            on_chunk(i, made, frames[-1])
        if frames_to is not None:
            check_finite(frames[-1], "decode", f"chunk {i}'s frames")
            frames_to.put(frames[-1])
    pipe.timings = None     # no phases of the bidirectional loop; last_stats: the sampler's
    return np.concatenate(frames, axis=0)


def check_call(root, chunk: Optional[int], call: dict, temporal: int) -> None:
    """A request on folder ``root`` against its transformer's ``causal_chunk`` (``chunk``;
    None: bidirectional), before any weights: ``context_chunks`` only for a causal folder,
    no CFG reuse (``cfg_cache``) on a causal one, and a causal folder's ``num_frames`` a
    whole number of chunks (``temporal``: the VAE's frames per latent frame);
    :class:`RequestError` in one line."""
    given = call.get("context_chunks")
    if chunk is None:
        if given is not None:
            raise RequestError(f"context_chunks={given} (sample.context_chunks) is for a causal "
                               f"model, but {root}'s transformer is bidirectional (no "
                               f"causal_chunk in its config.json); drop it")
        return
    if call.get("output") == "latent":
        raise RequestError(f"{root} is a causal student (model.causal_chunk={chunk}): it decodes "
                           f"chunk by chunk and makes no whole-video final latents "
                           f"(output='latent'), which ditax calibrate-cache measures; sample.cache"
                           f"= on it uses the numbers its transformer's config matches")
    if call.get("cfg_cache"):
        raise RequestError(f"sample.cfg_cache=true: {root} is a causal student (model."
                           f"causal_chunk={chunk}) whose chunks take no CFG reuse (a reuse "
                           f"step would run the conditional rows alone against a KV cache of "
                           f"both); drop it (sample.cache= works)")
    n = call.get("num_frames")
    if n is None:
        return
    latent = (n - 1) // temporal + 1
    if latent % chunk:
        lo, hi = latent // chunk * chunk, (latent // chunk + 1) * chunk
        pick = [temporal * (f - 1) + 1 for f in (lo, hi) if f]
        raise RequestError(f"--frames {n} makes {latent} latent frames, not a whole number of "
                           f"{root}'s causal chunks of {chunk} latent frames; use --frames "
                           f"{' or '.join(map(str, pick))}")


__all__ = ["check_call", "stream", "video"]
