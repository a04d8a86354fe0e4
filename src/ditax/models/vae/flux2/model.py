"""FLUX.2's image VAE (diffusers ``AutoencoderKLFlux2``) as one NNX module.

Architecturally it is diffusers' ``AutoencoderKL`` (the same ``Encoder`` / ``Decoder``, quant
convs, diagonal-Gaussian posterior, tiling arithmetic) with 32 latent channels, optionally other
decoder widths, and a latent BatchNorm whose statistics normalise the pipeline's latents. So
:class:`Flux2VAE` *is* a :class:`~ditax.models.vae.kl.FluxVAE` built from the KL VAE's blocks:
it inherits the compiled encode / decode programs, ``encode`` (the posterior mean: the mode the
pipelines take), ``encode_moments``, ``sample``, ``decode``, the tiled versions (diffusers'
tiles and blends) and ``autoencode``, and the row-split decode / encode of
:mod:`ditax.models.vae.parallel` serves it as is. What it changes: the two sides' configs, the
``bn`` statistics, and the latent normalisation (FLUX.2's BatchNorm formula on patchified
latents instead of FLUX.1's shift and scale).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.errors import RequestError
from ditax.models.vae.flux2.config import Flux2VAEConfig
from ditax.models.vae.flux2.latents import LatentBatchNorm, patchify_latents, unpatchify_latents
from ditax.models.vae.kl.model import FluxVAE


class Flux2VAE(FluxVAE):
    """diffusers ``AutoencoderKLFlux2`` in Flax NNX (``dtype``: parameters and compute; norms
    and the attention softmax in float32; ``attention``: the mid blocks' backend).

    Public tensors are diffusers' ``[B, C, H, W]``: images ``[B, 3, H, W]`` in [-1, 1] ↔ raw
    latents ``[B, 32, H/8, W/8]``. Pipeline latents are patchified and normalised:
    :meth:`patchify_latents` then :meth:`normalize_latents` after encoding,
    :meth:`denormalize_latents` then :meth:`unpatchify_latents` before decoding.
    """

    def __init__(self, config: Flux2VAEConfig, *, dtype=jnp.float32, rngs: nnx.Rngs,
                 attention: str = "xla"):
        config.validate()        # before its sides are read
        self.setup(config, (config.encoder_config(), config.decoder_config()), dtype, rngs,
                   attention)
        self.bn = LatentBatchNorm(config.bn_channels, config.batch_norm_eps, dtype=dtype)

    def _check_latents(self, z) -> None:
        shape, c = tuple(z.shape), self.latent_channels
        if len(shape) != 4 or shape[1] != c or 0 in shape:
            raise RequestError(f"FLUX.2 VAE decode: expected raw latents [B, {c}, Y, X] with no "
                               f"empty axis, got shape {shape}; denormalize and unpatchify the "
                               f"transformer's latents [B, {self.config.bn_channels}, Y/2, X/2] "
                               "first")

    # --- the latent BatchNorm statistics, as the pipelines read them
    @property
    def latents_bn_mean(self) -> jax.Array:
        """``bn.running_mean`` ``[4 · latent_channels]``."""
        return self.bn.running_mean[...]

    @property
    def latents_bn_var(self) -> jax.Array:
        """``bn.running_var`` ``[4 · latent_channels]``."""
        return self.bn.running_var[...]

    @property
    def batch_norm_eps(self) -> float:
        return self.config.batch_norm_eps

    # --- the pipelines' latent space
    def patchify_latents(self, z: jax.Array) -> jax.Array:
        """Raw latents ``[B, C, Y, X]`` → ``[B, 4C, Y/2, X/2]`` (``patch_size`` patches)."""
        return patchify_latents(z, self.config.patch_size)

    def unpatchify_latents(self, z: jax.Array) -> jax.Array:
        """``[B, 4C, Y, X]`` → raw latents ``[B, C, 2Y, 2X]``."""
        return unpatchify_latents(z, self.config.patch_size)

    def normalize_latents(self, z: jax.Array) -> jax.Array:
        """Patchified latents ``[B, 4C, Y, X]`` → ``(z - running_mean) / sqrt(running_var +
        eps)`` (the pipelines' ``_encode_vae_image``)."""
        return self.bn.normalize(z)

    def denormalize_latents(self, z: jax.Array) -> jax.Array:
        """Inverse of :meth:`normalize_latents`: ``z · sqrt(running_var + eps) +
        running_mean`` (the pipelines, before unpatchify and decode)."""
        return self.bn.denormalize(z)


__all__ = ["Flux2VAE"]
