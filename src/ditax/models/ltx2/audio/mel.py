"""Waveform → log-mel spectrogram as LTX-2's audio VAE was trained on it: what audio-to-video
conditioning and audio training data feed :meth:`~.audio_model.LTX2AudioVAE.encode`.

The transform is the LTX-2 trainer's ``AudioProcessor`` (and diffusers' Echo pipeline's
``_encode_audio``, the one waveform → audio-VAE path in diffusers 0.42): torchaudio's
``MelSpectrogram`` with a periodic Hann window of ``n_fft = 1024`` samples, frames centred by
reflecting ``n_fft / 2`` samples at both ends, one every ``hop_length`` (the VAE's
``mel_hop_length``, 160 at 16 kHz), magnitudes (power 1), a slaney-scale mel filterbank with
slaney area normalisation over 0 .. ``sample_rate / 2`` with ``mel_bins`` filters, then
``log(max(mel, 1e-5))``. The result is laid out ``[B, C, T, M]`` with ``T = N // hop + 1``.

The LTX-2.3 vocoder's own causal mel (stored STFT bases) is :class:`~.vocoder_bwe.MelSTFT`.
Resampling to ``sample_rate`` is the caller's (``ditax.io.audio.read_audio(path, sample_rate=)``
decodes at any rate).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from ditax.errors import RequestError

LOG_FLOOR = 1e-5
N_FFT = 1024          # the LTX-2 trainer's and diffusers' Echo pipeline's window
_MIN_LOG_HZ, _F_SP = 1000.0, 200.0 / 3      # slaney: linear to 1 kHz, then logarithmic
_LOGSTEP = math.log(6.4) / 27.0


def hz_to_mel(f):
    """Slaney mel of frequencies ``f`` (Hz): linear ``f / (200/3)`` below 1 kHz, logarithmic
    above (librosa's / torchaudio's ``mel_scale="slaney"``)."""
    f = np.asarray(f, np.float64)
    log = _MIN_LOG_HZ / _F_SP + np.log(np.maximum(f, _MIN_LOG_HZ) / _MIN_LOG_HZ) / _LOGSTEP
    return np.where(f >= _MIN_LOG_HZ, log, f / _F_SP)


def mel_to_hz(m):
    """Inverse of :func:`hz_to_mel`."""
    m = np.asarray(m, np.float64)
    min_log_mel = _MIN_LOG_HZ / _F_SP
    log = _MIN_LOG_HZ * np.exp(_LOGSTEP * (np.maximum(m, min_log_mel) - min_log_mel))
    return np.where(m >= min_log_mel, log, m * _F_SP)


def mel_filterbank(n_freqs: int, n_mels: int, sample_rate: int, f_min: float = 0.0,
                   f_max: float | None = None) -> np.ndarray:
    """Triangular slaney-scale filters with slaney (area) normalisation, ``[n_freqs, n_mels]``
    float64 (torchaudio ``melscale_fbanks(..., norm="slaney", mel_scale="slaney")``: the FFT
    bins span 0 .. ``sample_rate // 2``, ``n_mels + 2`` equally spaced mel edges)."""
    f_max = sample_rate / 2.0 if f_max is None else f_max
    freqs = np.linspace(0, sample_rate // 2, n_freqs)
    edges = mel_to_hz(np.linspace(hz_to_mel(f_min), hz_to_mel(f_max), n_mels + 2))
    width = np.diff(edges)
    slopes = edges[None, :] - freqs[:, None]                  # [n_freqs, n_mels + 2]
    rising = -slopes[:, :-2] / width[:-1]
    falling = slopes[:, 2:] / width[1:]
    fb = np.maximum(0.0, np.minimum(rising, falling))
    return fb * (2.0 / (edges[2:] - edges[:-2]))[None, :]


def hann_window(n: int) -> np.ndarray:
    """Periodic Hann window (``torch.hann_window``): ``0.5 - 0.5 cos(2 pi k / n)``."""
    return 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n) / n)


def stft_magnitude(x: jax.Array, n_fft: int, hop_length: int) -> jax.Array:
    """``|STFT|`` of ``x`` ``[..., N]``, centred frames (reflect-padded by ``n_fft / 2``) of a
    periodic Hann window every ``hop_length`` samples: ``[..., N // hop + 1, n_fft / 2 + 1]``."""
    pad = n_fft // 2
    xp = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(pad, pad)], mode="reflect")
    frames = (xp.shape[-1] - n_fft) // hop_length + 1
    index = hop_length * np.arange(frames)[:, None] + np.arange(n_fft)[None, :]
    window = jnp.asarray(hann_window(n_fft), x.dtype)
    return jnp.abs(jnp.fft.rfft(xp[..., index] * window, axis=-1))


def log_mel_spectrogram(waveform, *, sample_rate: int = 16000, hop_length: int = 160,
                        mel_bins: int = 64, n_fft: int = N_FFT) -> jax.Array:
    """Log-mel ``[B, C, N // hop_length + 1, mel_bins]`` (float32) of a waveform ``[B, C, N]``
    (or ``[C, N]``, giving B = 1) at ``sample_rate`` — the audio VAE's input. Defaults are
    LTX-2's (the audio VAE config's ``sample_rate``, ``mel_hop_length``, ``mel_bins``)."""
    x = jnp.asarray(waveform, jnp.float32)
    if x.ndim == 2:
        x = x[None]
    if x.ndim != 3 or 0 in x.shape[:2]:
        raise RequestError(f"log_mel_spectrogram: expected a waveform [B, C, N] or [C, N], got "
                           f"shape {tuple(np.shape(waveform))}")
    if x.shape[-1] <= n_fft // 2:
        raise RequestError(f"log_mel_spectrogram: {x.shape[-1]} samples are too few for a "
                           f"centred window of {n_fft} (reflection needs more than {n_fft // 2});"
                           " pad the waveform with zeros to at least n_fft samples")
    for name, v in (("sample_rate", sample_rate), ("hop_length", hop_length),
                    ("mel_bins", mel_bins), ("n_fft", n_fft)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise RequestError(f"log_mel_spectrogram: {name}={v!r} must be a positive int")
    fb = mel_filterbank(n_fft // 2 + 1, mel_bins, sample_rate)
    return _log_mel(x, jnp.asarray(fb, jnp.float32), n_fft=n_fft, hop_length=hop_length)


@functools.partial(jax.jit, static_argnames=("n_fft", "hop_length"))
def _log_mel(x: jax.Array, fb: jax.Array, n_fft: int, hop_length: int) -> jax.Array:
    mel = jnp.einsum("bctf,fm->bctm", stft_magnitude(x, n_fft, hop_length), fb)
    return jnp.log(jnp.maximum(mel, LOG_FLOOR))


def log_mel_for_vae(waveform, config, n_fft: int = N_FFT) -> jax.Array:
    """:func:`log_mel_spectrogram` with the sizes of an audio VAE ``config``
    (:class:`~.audio_config.LTX2AudioVAEConfig`: ``sample_rate``, ``mel_hop_length``,
    ``mel_bins``); the waveform must already be at ``config.sample_rate``."""
    if config.mel_bins is None:
        raise RequestError("log_mel_for_vae: the audio VAE config has mel_bins=null; call "
                           "log_mel_spectrogram with mel_bins=")
    return log_mel_spectrogram(waveform, sample_rate=config.sample_rate,
                               hop_length=config.mel_hop_length, mel_bins=config.mel_bins,
                               n_fft=n_fft)


__all__ = ["N_FFT", "hann_window", "hz_to_mel", "log_mel_for_vae", "log_mel_spectrogram",
           "mel_filterbank", "mel_to_hz", "stft_magnitude"]
