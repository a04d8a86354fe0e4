"""Training FLUX.1: the objective's Flux parts and the encoders ``ditax preprocess`` runs.

The generic flow loss (:mod:`ditax.train.loss`) mixes clean latents ``x0 [B, C, 1, Y, X]``
(the Flux VAE's posterior mean, ``(z - shift_factor) * scaling_factor`` as diffusers'
``FluxPipeline`` decodes them back) with noise at ``σ``: ``x_t = (1 - σ) x0 + σ ε``, target
``ε - x0``. :func:`denoise` is Flux's side of it: ``x_t`` packed into 2 x 2 tokens
``[B, (Y/2)(X/2), 4C]``, image position ids ``(0, row, col)`` and zero text ids, the
transformer fed ``σ = timestep / 1000`` (diffusers' ``FluxTransformer2DModel`` scales it by
1000 again inside), the pooled CLIP vector, and for FLUX.1-dev the guidance input held at
``flow.guidance`` (default :data:`DEFAULT_GUIDANCE`); the prediction unpacked to the latents'
layout. Every text token is attended (no padding mask), as the pipeline samples.

Timesteps: ``u`` uniform or logit-normal (``flow.timestep_sampler``), then with
``flow.dynamic_shift`` the resolution's shift of FLUX.1-dev's scheduler,
``σ = e^mu / (e^mu + 1/u - 1)`` with ``mu`` linear in the image token count ``L`` (0.5 at
256 tokens, 1.15 at 4096: :func:`ditax.schedulers.flow_match.flux_mu`) — which is the Wan
shift ``s·u / (1 + (s - 1)·u)`` with ``s = e^mu`` (:func:`resolution_shift`), so the loss's
one shift formula serves both. This is the shift diffusers' ``FluxPipeline`` samples with at
that size (BFL's ``time_shift``); diffusers' ``train_dreambooth_flux.py`` draws ``u`` the same
way but indexes the scheduler's own (for a dynamic-shifting scheduler: unshifted) sigma
table, i.e. ``flow.dynamic_shift=false``.
"""

from __future__ import annotations

import math
import pathlib

import jax.numpy as jnp

from ditax.errors import ConfigError, RequestError
from ditax.models.base import Encoders, TextEncoding
from ditax.models.flux.packing import PACK, image_ids, pack, text_ids, unpack

DEFAULT_GUIDANCE = 3.5    # FLUX.1-dev's embedded guidance while training (its pipeline's default)
POOLED = "pooled"         # the per-sample batch entry of the pooled CLIP vector [Dp]


def resolution_shift(image_tokens: int) -> float:
    """``s = e^mu`` of ``image_tokens`` packed tokens (FLUX.1-dev's dynamic shift as a Wan
    shift; see the module docstring)."""
    from ditax.schedulers.flow_match import flux_mu

    return math.exp(flux_mu(image_tokens))


def denoise(module, latents, timestep, text, pooled, guidance: float | None):
    """The Flux prediction for the flow loss: latents ``[B, C, 1, Y, X]``, ``timestep [B]``
    (0..1000), T5 text ``[B, T, Dt]``, ``pooled [B, Dp]``, ``guidance`` (a number for a model
    with a guidance embedding, else None) → ``[B, C, 1, Y, X]``."""
    cfg = module.cfg
    b, c, f, y, x = latents.shape
    if cfg.output_channels != cfg.in_channels:
        raise ConfigError(f"model.out_channels={cfg.out_channels} differs from in_channels="
                          f"{cfg.in_channels}: the flow loss compares the prediction with the "
                          f"latents, so train a model whose output is its input's width")
    if f != 1 or y % PACK or x % PACK:
        raise RequestError(f"Flux trains on still-image latents [C, 1, Y, X] with even Y, X "
                           f"(2x2 packing); got {tuple(latents.shape[1:])}")
    g = None if guidance is None else jnp.full((b,), guidance, jnp.float32)
    out = module(pack(latents[:, :, 0]), timestep / jnp.float32(1000), text,
                 pooled_projections=pooled, img_ids=image_ids(y, x),
                 txt_ids=text_ids(text.shape[1]), guidance=g)
    return unpack(out, y, x)[:, :, None]


class FluxEncoders(Encoders):
    """A ``FluxPipeline`` folder's VAE (``vae/``), CLIP (``text_encoder/``, ``tokenizer/``)
    and T5 (``text_encoder_2/``, ``tokenizer_2/``), as :mod:`ditax.pipelines.flux` loads
    them; each caption goes to both text towers (the pipeline's ``prompt_2`` default)."""

    def __init__(self, folder, dtype: str = "float32"):
        from ditax.models.encoders.clip import load_clip_text
        from ditax.models.vae.kl import load_vae
        from ditax.models.encoders.t5 import load_t5

        folder = pathlib.Path(folder)
        self.dtype = dtype
        self.vae = load_vae(folder, dtype)
        self.clip, self.clip_tokenizer = load_clip_text(folder, dtype)
        self.t5, self.t5_tokenizer = load_t5(folder, dtype)

    def encode_video(self, video):
        """``[B, 3, 1, H, W]`` in [-1, 1] → normalised posterior mean ``[B, C, 1, Y, X]``
        float32 (a still image is one frame)."""
        video = jnp.asarray(video)
        if video.ndim != 5 or video.shape[2] != 1:
            raise RequestError(f"Flux encodes still images [B, 3, 1, H, W]; got shape "
                               f"{tuple(video.shape)} (use --frames 1)")
        z = self.vae.encode(video[:, :, 0].astype(self.dtype))
        z = self.vae.normalize_latents(jnp.asarray(z, jnp.float32))
        if z.shape[2] % PACK or z.shape[3] % PACK:
            s = self.vae.scale_factor_spatial * PACK
            raise RequestError(f"image size {video.shape[3]}x{video.shape[4]} gives latents "
                               f"{z.shape[2]}x{z.shape[3]}, not even for the 2x2 packing; use "
                               f"multiples of {s}")
        return z[:, :, None]

    def encode_text(self, captions, text_len: int) -> TextEncoding:
        """T5 embeddings ``[B, text_len, Dt]`` (every token encoded unmasked, as the pipeline),
        the T5 token mask, and the pooled CLIP vectors ``extra["pooled"] [B, Dp]``."""
        from ditax.models.encoders.clip import encode_clip_pooled
        from ditax.models.encoders.t5 import encode_t5_prompt

        captions = list(captions)
        _, mask = self.t5_tokenizer.encode(captions, text_len)
        emb = encode_t5_prompt(self.t5_tokenizer, self.t5, captions, text_len)
        pooled = encode_clip_pooled(self.clip_tokenizer, self.clip, captions)
        return TextEncoding(jnp.asarray(emb, jnp.float32), mask,
                            {POOLED: jnp.asarray(pooled, jnp.float32)})


__all__ = ["DEFAULT_GUIDANCE", "POOLED", "FluxEncoders", "denoise", "resolution_shift"]
