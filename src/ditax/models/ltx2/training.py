"""Training LTX-2: the denoiser call of the flow loss on both streams, and the timestep shift.

The objective is the LTX-2 trainer's (Lightricks' ``ltx-trainer``, ``TextToVideoStrategy``
with ``with_audio``): the video latents ``x0 [B, C, F, Y, X]`` (the video VAE's normalised
posterior mean) and the audio latents ``a0 [B, La, Ca]`` (the audio VAE's normalised posterior
mean, packed into tokens as the pipeline packs them) are noised with their own noise at the
same ``σ`` (``x_t = (1 - σ) x0 + σ ε``), the transformer predicts both velocities in one call,
and the loss is, per sample, the video's mean squared velocity error plus the audio's (each a
mean over its own elements), averaged over the batch — the generic loss's further-stream
mechanism (:func:`ditax.train.loss.joint_flow_loss`, the family's ``noised_entries``) with
the entry :data:`AUDIO`.

:func:`denoise` is the family's side: the video latents packed into tokens as diffusers'
``LTX2Pipeline._pack_latents`` packs them (patches of ``patch_size_t x patch_size x
patch_size``, channel-major features), ``timestep = 1000 σ`` for both streams and as the
prompt modulation's ``sigma`` (what the pipeline feeds at that noise level), one text mask
for both streams, the RoPE positions of the latent grid at :data:`FPS` (the frame rate the
training clips are read at), and the video prediction unpacked to the latents' layout. The
text entry of a sample is the video text and the audio text side by side on the feature axis
``[T, Dv + Da]`` (one mask): the two connector outputs of one caption
(:class:`~ditax.models.ltx2.training_encoders.LTX2Encoders`).

Timesteps: the LTX-2 trainer draws ``σ`` from a logit-normal whose mean is ``mu``, linear in
the video token count (0.95 at 1024 tokens, 2.05 at 4096 — the pipeline's scheduler shift);
``flow.timestep_sampler=logit_normal`` with ``flow.dynamic_shift=true`` is that draw (a
logit-normal shifted by ``e^mu`` is a logit-normal of mean ``mu``: :func:`resolution_shift`).
The trainer's stretching of the draws between two percentiles and its 10 % of uniform draws
are not reproduced.

First-frame conditioning (image-to-video; the trainer's ``first_frame_conditioning_p``,
``train.first_frame_p`` here, 0 by default): a drawn sample keeps its first latent frame clean,
its tokens run at timestep 0 (per-token video timesteps, as ``LTX2ImageToVideoPipeline`` feeds
them) and leave the video loss (masked mean over the other frames); the audio stream and the
prompt modulation's ``sigma`` keep the sample's timestep (:func:`first_frame_inputs`). A sample
of one latent frame is never conditioned (nothing would be left to learn).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from ditax.errors import ConfigError, RequestError

AUDIO = "audio_latents"   # the condition entry of the packed, normalised audio latents [La, Ca]
FPS = 24.0                # the frame rate LTX-2 trains and samples at (diffusers' default)
#: the pipeline scheduler's dynamic shift (LTX-2's ``scheduler_config.json``), which the
#: LTX-2 trainer's timestep sampler uses too: mu from 0.95 at 1024 to 2.05 at 4096 tokens
SHIFT_TOKENS, SHIFT_MU = (1024, 4096), (0.95, 2.05)


def resolution_shift(video_tokens: int) -> float:
    """``e^mu`` of ``video_tokens`` video tokens (:data:`SHIFT_TOKENS` / :data:`SHIFT_MU`),
    as the generic loss's shift ``s·u / (1 + (s - 1)·u)``."""
    from ditax.schedulers.flow_match import flux_mu

    return math.exp(flux_mu(video_tokens, *SHIFT_TOKENS, *SHIFT_MU))


def pack_video(latents, patch_t: int, patch: int):
    """``[B, C, F, Y, X]`` → tokens ``[B, (F/pt)(Y/p)(X/p), C·pt·p·p]`` (diffusers'
    ``_pack_latents``: frame-major tokens, channel-major features)."""
    b, c, f, y, x = latents.shape
    z = latents.reshape(b, c, f // patch_t, patch_t, y // patch, patch, x // patch, patch)
    z = jnp.transpose(z, (0, 2, 4, 6, 1, 3, 5, 7))
    return z.reshape(b, (f // patch_t) * (y // patch) * (x // patch), c * patch_t * patch * patch)


def unpack_video(tokens, shape, patch_t: int, patch: int):
    """The inverse of :func:`pack_video` for latents of ``shape = (C, F, Y, X)``."""
    c, f, y, x = shape
    b = tokens.shape[0]
    z = tokens.reshape(b, f // patch_t, y // patch, x // patch, c, patch_t, patch, patch)
    z = jnp.transpose(z, (0, 4, 1, 5, 2, 6, 3, 7))
    return z.reshape(b, c, f, y, x)


def first_frame_inputs(x_t, x0, timestep, mask, key, p: float, patch_t: int, tokens: int):
    """``(x_t, timestep [B, L], mask [B, 1, F, 1, 1])``: each sample of more than ``patch_t``
    latent frames is drawn (``key``, probability ``p``) to keep its first latent frame clean —
    ``x0`` there, timestep 0 on that frame's tokens (``tokens`` per latent frame after
    ``patch_t`` packing), left out of the loss ``mask`` (combined with an incoming ``mask``)."""
    b, f = x0.shape[0], x0.shape[2]
    drawn = (jax.random.uniform(key, (b,)) < p) & (f > patch_t)            # [B]
    clean = drawn[:, None] & (jnp.arange(f) < patch_t)[None, :]             # [B, F]
    keep = clean[:, None, :, None, None]
    x_t = jnp.where(keep, x0, x_t)
    frame_mask = (~keep).astype(x_t.dtype)
    mask = frame_mask if mask is None else mask * frame_mask
    per_token = jnp.repeat(1.0 - clean[:, ::patch_t].astype(jnp.float32), tokens, axis=1)
    t = jnp.asarray(timestep, jnp.float32)
    if t.ndim == 1:
        t = t[:, None]
    return x_t, t * per_token, mask


def denoise(module, latents, timestep, text, text_mask, audio):
    """Both streams' velocity predictions for the flow loss: video latents ``[B, C, F, Y, X]``,
    ``timestep [B]`` or per video token ``[B, L]`` (0..1000; first-frame conditioning: 0 on
    the clean frame's tokens, the sample's timestep — their maximum — for the audio stream and
    ``sigma``), ``text [B, T, Dv + Da]`` (video text, then audio text),
    ``text_mask [B, T]`` (or None: every token), audio tokens ``[B, La, Ca]`` →
    ``(video [B, C, F, Y, X], audio [B, La, Ca])`` in the inputs' dtypes."""
    cfg = module.cfg
    b, c, f, y, x = latents.shape
    pt, p = cfg.patch_size_t, cfg.patch_size
    if f % pt or y % p or x % p:
        raise RequestError(f"latents {tuple(latents.shape[1:])}: the LTX-2 model packs "
                           f"{pt}x{p}x{p} latent patches; the frames, height and width must "
                           f"be multiples of them")
    dv = cfg.text_dim
    if text.shape[-1] != dv + cfg.audio_text_dim:
        raise RequestError(f"text of width {text.shape[-1]}: LTX-2 trains on the video text "
                           f"({dv}) and the audio text ({cfg.audio_text_dim}) side by side, "
                           f"{dv + cfg.audio_text_dim} wide; preprocess with the model's "
                           f"pipeline folder")
    positions = module.positions(f, y, x, fps=FPS, audio_num_frames=audio.shape[1])
    t = jnp.asarray(timestep, jnp.float32)
    ts = t if t.ndim == 1 else jnp.max(t, axis=1)     # the sample's own (unconditioned tokens)
    video, sound = module(pack_video(latents, pt, p), audio, text[..., :dv], text[..., dv:], t,
                          audio_timestep=ts, sigma=ts, encoder_attention_mask=text_mask,
                          audio_encoder_attention_mask=text_mask, positions=positions,
                          use_cross_timestep=True)
    return unpack_video(video, (c, f, y, x), pt, p).astype(latents.dtype), sound.astype(
        audio.dtype)


def check_training(m) -> None:
    """:class:`ConfigError` for an LTX-2 config the flow loss cannot train: each stream's
    output must be its input's width (the loss compares the prediction with the latents), and
    the audio tokens must be the stored latent frames (no audio patches)."""
    for what, out, inp in (("out_channels", m.video_out_channels, m.in_channels),
                           ("audio_out_channels", m.audio_output_channels,
                            m.audio_in_channels)):
        if out != inp:
            raise ConfigError(f"model.{what}={out} differs from its input width {inp}: the "
                              f"flow loss compares the prediction with the latents, so train "
                              f"a model whose output is its input's width")
    if m.audio_patch_size != 1 or m.audio_patch_size_t != 1:
        raise ConfigError(f"model.audio_patch_size={m.audio_patch_size}, audio_patch_size_t="
                          f"{m.audio_patch_size_t}: ditax trains LTX-2 on one token per audio "
                          f"latent frame (as the pipeline samples); use 1 and 1")


__all__ = ["AUDIO", "FPS", "check_training", "denoise", "first_frame_inputs", "pack_video",
           "resolution_shift",
           "unpack_video"]
