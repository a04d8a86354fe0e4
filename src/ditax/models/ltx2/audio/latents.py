"""The LTX-2 pipeline's audio-latent arithmetic (diffusers ``LTX2Pipeline``): how many latent
frames a video's sound track gets, packing latents into transformer tokens and back, and the
per-feature normalisation with the audio VAE's ``latents_mean`` / ``latents_std``.

The pipeline's order (diffusers 0.42):

- ``A = audio_latent_frames(num_frames, frame_rate)``: ``round(num_frames / frame_rate *
  sample_rate / hop_length / 4)`` (Python's round: halves go to even) — 121 frames at 24 fps →
  126 latent frames;
- noise ``[B, latent_channels, A, mel_bins // 4]`` → :func:`pack_audio_latents` →
  ``[B, A, latent_channels * mel_bins // 4]`` tokens (8 x 16 = 128 for LTX-2); given latents
  ``[B, C, A, M]`` are packed, then :func:`normalize_audio_latents`;
- after denoising: :func:`denormalize_audio_latents` on the tokens, :func:`unpack_audio_latents`
  to ``[B, C, A, M]``, the audio VAE's decode to a mel ``[B, 2, 4A - 3, 64]``, and the vocoder
  takes that mel as it is.

``latents_mean`` / ``latents_std`` hold one value per token feature (``C * M``: channel-major,
bin-minor), which is why the normalisation runs on packed tokens. diffusers' patched packing
(``patch_size`` / ``patch_size_t``) is not used by the pipeline (and its pack raises a
TypeError on float sizes in 0.42); only the default packing is here.
"""

from __future__ import annotations

import math
import numbers

import jax
import jax.numpy as jnp

from ditax.errors import RequestError
from ditax.models.ltx2.audio.config import LATENT_FACTOR


def audio_latent_frames(num_frames: int, frame_rate: float, sample_rate: int = 16000,
                        hop_length: int = 160, temporal_factor: int = LATENT_FACTOR) -> int:
    """Latent audio frames of a ``num_frames`` video played at ``frame_rate`` fps:
    ``round(num_frames / frame_rate * (sample_rate / hop_length / temporal_factor))``, the
    same float operations in the same order as diffusers (``sample_rate``, ``hop_length``:
    the audio VAE config's ``sample_rate`` / ``mel_hop_length``)."""
    if (isinstance(num_frames, bool) or not isinstance(num_frames, numbers.Integral)
            or num_frames < 1):
        raise RequestError(f"audio_latent_frames: num_frames={num_frames!r} must be a positive "
                           "int (video frames)")
    if (isinstance(frame_rate, bool) or not isinstance(frame_rate, numbers.Real)
            or not math.isfinite(frame_rate) or frame_rate <= 0):
        raise RequestError(f"audio_latent_frames: frame_rate={frame_rate!r} must be a positive "
                           "finite number of frames per second")
    for name, v in (("sample_rate", sample_rate), ("hop_length", hop_length),
                    ("temporal_factor", temporal_factor)):
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not v > 0:
            raise RequestError(f"audio_latent_frames: {name}={v!r} must be positive")
    duration_s = int(num_frames) / float(frame_rate)
    per_second = sample_rate / hop_length / float(temporal_factor)
    frames = round(duration_s * per_second)
    if frames < 1:
        raise RequestError(f"audio_latent_frames: {num_frames} frames at {frame_rate} fps last "
                           f"{duration_s:.4g} s, less than half of one audio latent frame "
                           f"({1 / per_second:.4g} s); ask for more frames or a lower frame rate")
    return frames


def latent_mel_bins(mel_bins: int, mel_factor: int = LATENT_FACTOR) -> int:
    """Latent bins of a ``mel_bins`` spectrogram: ``mel_bins // 4`` (64 → 16), as the pipeline."""
    return mel_bins // mel_factor


def audio_latent_shape(batch: int, latent_channels: int, frames: int, mel_bins: int,
                       mel_factor: int = LATENT_FACTOR) -> tuple[int, int, int, int]:
    """The unpacked noise shape the pipeline draws: ``[B, latent_channels, frames,
    mel_bins // 4]``."""
    return batch, latent_channels, frames, latent_mel_bins(mel_bins, mel_factor)


def pack_audio_latents(latents: jax.Array) -> jax.Array:
    """``[B, C, A, M]`` → tokens ``[B, A, C * M]`` (feature ``c * M + m``)."""
    if latents.ndim != 4:
        raise RequestError(f"pack_audio_latents: expected latents [B, C, A, M], got shape "
                           f"{tuple(latents.shape)}; packed tokens [B, A, C*M] need no packing")
    b, c, a, m = latents.shape
    return jnp.transpose(latents, (0, 2, 1, 3)).reshape(b, a, c * m)


def unpack_audio_latents(tokens: jax.Array, latent_mel_bins: int,
                         latent_length: int | None = None) -> jax.Array:
    """Tokens ``[B, A, C * M]`` → ``[B, C, A, M]`` with ``M = latent_mel_bins`` (16 for LTX-2);
    ``latent_length``, when given, must equal A (diffusers takes it and does not check)."""
    shape = tuple(tokens.shape)
    if len(shape) != 3 or latent_mel_bins <= 0 or shape[2] % latent_mel_bins:
        raise RequestError(f"unpack_audio_latents: expected tokens [B, A, C*{latent_mel_bins}], "
                           f"got shape {shape}; pass the latent mel bins (mel_bins // 4)")
    if latent_length is not None and latent_length != shape[1]:
        raise RequestError(f"unpack_audio_latents: latent_length={latent_length} but the tokens "
                           f"hold {shape[1]} frames (shape {shape})")
    b, a, f = shape
    return jnp.transpose(tokens.reshape(b, a, f // latent_mel_bins, latent_mel_bins),
                         (0, 2, 1, 3))


def _stats(tokens, mean, std, what: str):
    mean, std = jnp.asarray(mean), jnp.asarray(std)
    if tokens.ndim != 3 or mean.shape != (tokens.shape[-1],) or std.shape != mean.shape:
        raise RequestError(f"{what}: tokens {tuple(tokens.shape)} need latents_mean / "
                           f"latents_std of one value per feature, got {tuple(mean.shape)} / "
                           f"{tuple(std.shape)}; pack [B, C, A, M] latents first (the audio "
                           "VAE's base_channels must equal latent_channels * mel_bins // 4)")
    return mean.astype(tokens.dtype), std.astype(tokens.dtype)


def normalize_audio_latents(tokens: jax.Array, latents_mean, latents_std) -> jax.Array:
    """``(tokens - latents_mean) / latents_std`` per feature of packed ``[B, A, C * M]``."""
    mean, std = _stats(tokens, latents_mean, latents_std, "normalize_audio_latents")
    return (tokens - mean) / std


def denormalize_audio_latents(tokens: jax.Array, latents_mean, latents_std) -> jax.Array:
    """``tokens * latents_std + latents_mean``: the inverse of :func:`normalize_audio_latents`."""
    mean, std = _stats(tokens, latents_mean, latents_std, "denormalize_audio_latents")
    return tokens * std + mean


__all__ = ["audio_latent_frames", "audio_latent_shape", "denormalize_audio_latents",
           "latent_mel_bins", "normalize_audio_latents", "pack_audio_latents",
           "unpack_audio_latents"]
