"""LTX-2's audio VAE (diffusers ``AutoencoderKLLTX2Audio``) as one NNX module: log-mel
spectrogram → diagonal-Gaussian posterior over latents, latents → mel, the pipeline's latent
normalisation with the loaded ``latents_mean`` / ``latents_std``, and a differentiable
autoencode for training.

Public tensors use diffusers' layout: mel ``[B, C, T, M]`` (C audio channels, T mel frames, M
mel bins), latents ``[B, latent_channels, F, M']``; inside everything is channels-last. The
jitted :func:`encode_program` / :func:`decode_program` are pure functions of ``(graphdef,
state, x)``, one compile per shape. Sizes: frames and bins shrink ``n → (n + pad - 3) // 2 + 1``
at each downsampling level (``"height"``: T → ceil(T / 2), M → floor(M / 2)); decoding gives
``max(4F - 3, 1)`` frames and ``mel_bins`` bins whatever the architecture's factor.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.errors import RequestError
from ditax.models.ltx2.audio.blocks import downsampled
from ditax.models.ltx2.audio.coders import Decoder, Encoder
from ditax.models.ltx2.audio.config import LTX2AudioVAEConfig
from ditax.models.ltx2.audio.latents import denormalize_audio_latents, normalize_audio_latents
from ditax.models.ltx2.audio.layers import Buffer
# the diagonal-Gaussian VAE's programs and moments split, as FLUX.1's 2-D VAE has them (both
# run ``moments`` / ``decode_latents`` on channels-last arrays)
from ditax.models.vae.kl.model import (LOGVAR_RANGE, decode_program, encode_program,
                                       split_moments)


class LTX2AudioVAE(nnx.Module):
    """diffusers ``AutoencoderKLLTX2Audio`` in Flax NNX (``dtype``: parameters and compute;
    norms in float32). ``attention``: the :func:`ditax.attention.attend` backend of the
    attention blocks, where a config has them (no public LTX-2 model does).

    ``encode`` returns the posterior mean (the mode, what the LTX-2 pipelines use), ``sample``
    a draw, ``encode_moments`` both moments; ``decode`` the mel spectrogram the vocoder takes.
    ``normalize_latents`` / ``denormalize_latents`` are the pipeline's per-feature statistics
    on packed tokens ``[B, A, latent_channels * M']`` (see :mod:`.audio_latents`).
    """

    def __init__(self, config: LTX2AudioVAEConfig, *, dtype=jnp.float32, rngs: nnx.Rngs,
                 attention: str = "xla"):
        config.validate()
        self.config = config
        self.dtype = jnp.dtype(dtype)
        self.encoder = Encoder(config, dtype=dtype, rngs=rngs, attention=attention)
        self.decoder = Decoder(config, dtype=dtype, rngs=rngs, attention=attention)
        # diffusers sizes the statistics by base_channels (= latent_channels * mel_bins // 4
        # in every public model: 128 token features)
        self.latents_mean = Buffer(jnp.zeros((config.base_channels,), dtype))
        self.latents_std = Buffer(jnp.ones((config.base_channels,), dtype))

    # --- config views
    @property
    def latent_channels(self) -> int:
        return self.config.latent_channels

    @property
    def sample_rate(self) -> int:
        """Audio samples per second of the mel's waveform (16000 for LTX-2)."""
        return self.config.sample_rate

    @property
    def hop_length(self) -> int:
        """Waveform samples per mel frame (``mel_hop_length``; 160 for LTX-2)."""
        return self.config.mel_hop_length

    # --- traced pieces (channels-last; for jit, grad and trainers)
    def moments(self, x: jax.Array) -> jax.Array:
        """Mel ``[B, T, M, C]`` → moments ``[B, F, M', 2 latent_channels]`` (before the clamp)."""
        return self.encoder(x)

    def decode_latents(self, z: jax.Array) -> jax.Array:
        """Latents ``[B, F, M', latent_channels]`` → mel ``[B, T, mel_bins, output_channels]``."""
        return self.decoder(z)

    def autoencode(self, x: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Differentiable encode → posterior draw → decode of a channels-last mel ``x``
        ``[B, T, M, C]``: (reconstruction ``[B, max(4F - 3, 1), mel_bins, C]``, mean,
        log-variance ``[B, F, M', latent_channels]``) — the training forward."""
        mean, logvar = split_moments(self.moments(x))
        eps = jax.random.normal(key, mean.shape, jnp.float32).astype(mean.dtype)
        return self.decode_latents(mean + jnp.exp(0.5 * logvar) * eps), mean, logvar

    # --- the pipeline's latent normalisation (packed tokens)
    def normalize_latents(self, tokens: jax.Array) -> jax.Array:
        """``(tokens - latents_mean) / latents_std`` of packed ``[B, A, latent_channels * M']``."""
        return normalize_audio_latents(tokens, self.latents_mean[...], self.latents_std[...])

    def denormalize_latents(self, tokens: jax.Array) -> jax.Array:
        """``tokens * latents_std + latents_mean``: the inverse of :meth:`normalize_latents`."""
        return denormalize_audio_latents(tokens, self.latents_mean[...], self.latents_std[...])

    # --- sizes
    def latent_size(self, frames: int, bins: int) -> tuple[int, int]:
        """Latent ``(F, M')`` of a mel of ``frames`` x ``bins`` (either below 1: too small)."""
        for _ in range(len(self.config.ch_mult) - 1):
            frames = downsampled(frames, self.config.causality_axis, 0)
            bins = downsampled(bins, self.config.causality_axis, 1)
        return frames, bins

    def _program(self, program, x) -> jax.Array:
        x = jnp.transpose(jnp.asarray(x, self.dtype), (0, 2, 3, 1))
        return jnp.transpose(program(*nnx.split(self), x), (0, 3, 1, 2))

    # --- encode
    def _check_mel(self, mel) -> None:
        shape, c = tuple(jnp.shape(mel)), self.config.in_channels
        if len(shape) != 4 or shape[1] != c:
            raise RequestError(f"audio VAE encode: expected a mel spectrogram [B, {c}, T, M] "
                               f"(T frames, M mel bins), got shape {shape}")
        f, m = self.latent_size(shape[2], shape[3])
        if 0 in shape or f < 1 or m < 1:
            raise RequestError(f"audio VAE encode: a mel of {shape[2]} frames x {shape[3]} bins "
                               f"(batch {shape[0]}) is too small for "
                               f"{len(self.config.ch_mult) - 1} downsampling levels; give at "
                               "least a few frames and the model's mel_bins "
                               f"({self.config.mel_bins})")

    def encode_moments(self, mel: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Posterior (mean, log-variance clamped to [-30, 20]), each ``[B, latent_channels, F,
        M']``, of a log-mel ``[B, in_channels, T, M]`` (from a waveform:
        :func:`~.audio_mel.log_mel_for_vae`)."""
        self._check_mel(mel)
        h = self._program(encode_program, mel)
        mean, logvar = jnp.split(h, 2, axis=1)
        return mean, jnp.clip(logvar, *LOGVAR_RANGE)

    def encode(self, mel: jax.Array) -> jax.Array:
        """Posterior mean ``[B, latent_channels, F, M']`` of a mel ``[B, C, T, M]``."""
        return self.encode_moments(mel)[0]

    def sample(self, mel: jax.Array, key: jax.Array) -> jax.Array:
        """A posterior draw ``mean + exp(logvar / 2) * N(0, 1)``, shape as :meth:`encode`."""
        mean, logvar = self.encode_moments(mel)
        eps = jax.random.normal(key, mean.shape, jnp.float32).astype(mean.dtype)
        return mean + jnp.exp(0.5 * logvar) * eps

    # --- decode
    def decode(self, latents: jax.Array) -> jax.Array:
        """Mel ``[B, output_channels, max(4F - 3, 1), mel_bins]`` from raw (denormalised,
        unpacked) latents ``[B, latent_channels, F, M']``."""
        shape, c = tuple(jnp.shape(latents)), self.latent_channels
        if len(shape) != 4 or shape[1] != c or 0 in shape:
            raise RequestError(f"audio VAE decode: expected latents [B, {c}, F, M'] with no "
                               f"empty axis, got shape {shape}; unpack the transformer's tokens "
                               f"[B, F, {c}*M'] with unpack_audio_latents first")
        return self._program(decode_program, latents)


__all__ = ["LTX2AudioVAE", "decode_program", "encode_program", "split_moments"]
