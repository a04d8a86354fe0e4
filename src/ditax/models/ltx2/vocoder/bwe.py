"""LTX-2.3 / 2.5's vocoder with bandwidth extension (diffusers ``LTX2VocoderWithBWE``) in Flax
NNX, and its causal log-mel (diffusers ``MelSTFT`` / ``CausalSTFT``).

mel ``[B, C, T, M]`` → ``vocoder`` (an :class:`~.vocoder_model.LTX2Vocoder`) → waveform at
``input_sampling_rate`` (16 kHz), zero-padded to whole hops → ``mel_stft``: a causal STFT
(``window_length - hop_length`` zeros before the start, one frame every ``hop_length`` samples,
the windowed DFT bases read from the checkpoint) → magnitude → ``mel_basis`` → log(max(., 1e-5))
per audio channel → ``bwe_generator`` (a second vocoder) → a residual added to the waveform
resampled by ``output / input`` rate with a Hann-windowed sinc (3x: 48 kHz) → clamp to [-1, 1],
cut to ``samples x ratio``. The STFT bases and mel filterbank are the checkpoint's buffers (the
original model's, in bfloat16); a fresh model holds zeros, as diffusers' does.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.models.ltx2.audio.layers import Buffer
from ditax.models.ltx2.vocoder.config import LTX2VocoderBWEConfig
from ditax.models.ltx2.vocoder.layers import hann_sinc_filter, upsample
from ditax.models.ltx2.vocoder.model import LTX2Vocoder

LOG_FLOOR = 1e-5        # log(max(mel, 1e-5)), as diffusers and the LTX-2 trainer
RESAMPLE_WIDTH = 6      # zero crossings each side of the resampler's sinc (diffusers' default)
RESAMPLE_ROLLOFF = 0.99


class CausalSTFT(nnx.Module):
    """Magnitude of a causal STFT: ``[B, N]`` → ``[B, N / hop, F]`` (F = filter_length / 2 + 1
    bins) from the stored bases ``forward_basis`` ``[filter_length, 1, 2F]`` (real rows, then
    imaginary; torch ``[2F, 1, filter_length]``). ``inverse_basis`` is loaded but unused, as in
    diffusers' forward."""

    def __init__(self, filter_length: int, hop_length: int, window_length: int, *, dtype):
        self.hop, self.left = hop_length, max(0, window_length - hop_length)
        bins = filter_length // 2 + 1
        self.forward_basis = Buffer(jnp.zeros((filter_length, 1, 2 * bins), dtype))
        self.inverse_basis = Buffer(jnp.zeros((filter_length, 1, 2 * bins), dtype))

    def __call__(self, wave: jax.Array) -> jax.Array:
        w = self.forward_basis[...]
        x = jnp.pad(wave.astype(w.dtype), ((0, 0), (self.left, 0)))[..., None]
        spec = jax.lax.conv_general_dilated(x, w, (self.hop,), [(0, 0)],
                                            dimension_numbers=("NWC", "WIO", "NWC"))
        real, imag = jnp.split(spec, 2, axis=-1)
        return jnp.sqrt(jnp.square(real) + jnp.square(imag))


class MelSTFT(nnx.Module):
    """Causal log-mel ``[B, N]`` → ``[B, N / hop, num_mel_channels]``: :class:`CausalSTFT`
    magnitudes through ``mel_basis`` ``[mels, F]``, then ``log(max(., 1e-5))``."""

    def __init__(self, filter_length: int, hop_length: int, window_length: int, mels: int, *,
                 dtype):
        self.stft_fn = CausalSTFT(filter_length, hop_length, window_length, dtype=dtype)
        self.mel_basis = Buffer(jnp.zeros((mels, filter_length // 2 + 1), dtype))

    def __call__(self, wave: jax.Array) -> jax.Array:
        mag = self.stft_fn(wave)
        mel = jnp.einsum("btf,mf->btm", mag, self.mel_basis[...].astype(mag.dtype))
        return jnp.log(jnp.maximum(mel, LOG_FLOOR))


class LTX2VocoderWithBWE(nnx.Module):
    """diffusers ``LTX2VocoderWithBWE``: called like :class:`~.vocoder_model.LTX2Vocoder`,
    mel ``[B, C, T, M]`` → waveform ``[B, C, T x prod(upsample_factors) x ratio]`` at
    ``sample_rate`` (48 kHz for LTX-2.3)."""

    def __init__(self, config: LTX2VocoderBWEConfig, *, dtype=jnp.float32, rngs: nnx.Rngs):
        config.validate()
        self.config = config
        self.dtype = jnp.dtype(dtype)
        self.vocoder = LTX2Vocoder(config.stage(False), dtype=dtype, rngs=rngs)
        self.bwe_generator = LTX2Vocoder(config.stage(True), dtype=dtype, rngs=rngs)
        self.mel_stft = MelSTFT(config.filter_length, config.hop_length, config.window_length,
                                config.num_mel_channels, dtype=dtype)

    @property
    def sample_rate(self) -> int:
        """Samples per second of the final waveform (``output_sampling_rate``)."""
        return self.config.sample_rate

    def resample(self, wave: jax.Array) -> jax.Array:
        """``[B, N, C]`` → ``[B, ratio N, C]`` with the Hann-windowed sinc (diffusers'
        ``UpSample1d(window_type="hann")``: replicate-pad the half width, filter, crop)."""
        r = self.config.ratio
        taps = hann_sinc_filter(r, RESAMPLE_WIDTH, RESAMPLE_ROLLOFF)
        half = math.ceil(RESAMPLE_WIDTH / RESAMPLE_ROLLOFF)
        return upsample(wave, jnp.asarray(taps, wave.dtype), r, half,
                        (2 * half * r, taps.shape[0] - r))

    def generate(self, x: jax.Array) -> jax.Array:
        """Mel features ``[B, T, in_channels]`` → waveform ``[B, S, out_channels]``
        (channels-last, traced)."""
        cfg = self.config
        wave = self.vocoder.generate(x)                       # [B, N, C] at the input rate
        b, n, c = wave.shape
        if n % cfg.hop_length:                                # whole hops: one mel frame each
            wave = jnp.pad(wave, ((0, 0), (0, cfg.hop_length - n % cfg.hop_length), (0, 0)))
        mel = self.mel_stft(jnp.transpose(wave, (0, 2, 1)).reshape(b * c, -1))  # [BC, T, M]
        feats = jnp.transpose(mel.reshape(b, c, *mel.shape[1:]), (0, 2, 1, 3))   # [B, T, C, M]
        residual = self.bwe_generator.generate(feats.reshape(b, feats.shape[1], -1))
        out = jnp.clip(residual + self.resample(wave), -1.0, 1.0)
        return out[:, :n * cfg.output_sampling_rate // cfg.input_sampling_rate]

    def __call__(self, mel, time_last: bool = False) -> jax.Array:
        """Waveform ``[B, out_channels, samples]`` of a mel ``[B, C, T, M]`` (diffusers' call)."""
        y = bwe_program(*nnx.split(self), self.vocoder.features(mel, time_last))
        return jnp.transpose(y, (0, 2, 1))


@functools.partial(jax.jit, static_argnames=("graphdef",))
def bwe_program(graphdef, state, x: jax.Array) -> jax.Array:
    """``[B, T, in_channels]`` → ``[B, S, out_channels]`` through
    :meth:`LTX2VocoderWithBWE.generate`."""
    return nnx.merge(graphdef, state).generate(x)


__all__ = ["CausalSTFT", "LTX2VocoderWithBWE", "MelSTFT", "bwe_program"]
