"""diffusers' ``AutoencoderKLFlux2`` in Flax NNX: FLUX.2's image VAE (dev and klein).

An image ``[B, 3, H, W]`` in [-1, 1] encodes to a diagonal Gaussian over latents
``[B, 32, H/8, W/8]`` and decodes back. The architecture is the KL VAE's
(:mod:`ditax.models.vae.kl`, whose blocks it is built from); what is FLUX.2's own is the config
(:class:`Flux2VAEConfig`: ``AutoencoderKLFlux2``'s names, decoder widths of their own) and the
latent BatchNorm statistics that the pipelines use to normalise patchified latents
``[B, 128, H/16, W/16]``.

Modules: ``config`` (:class:`Flux2VAEConfig`), ``latents`` (the BatchNorm statistics, patchify
/ unpatchify), ``model`` (:class:`Flux2VAE`, a :class:`~ditax.models.vae.kl.FluxVAE`: encode,
sample, decode, tiled encode / decode, and the row-split decode of
:func:`ditax.models.vae.parallel.decode`), ``convert`` (the weights table,
:func:`load_flux2_vae`).
"""

from ditax.models.vae.flux2.config import Flux2VAEConfig
from ditax.models.vae.flux2.convert import load_flux2_vae
from ditax.models.vae.flux2.latents import patchify_latents, unpatchify_latents
from ditax.models.vae.flux2.model import Flux2VAE

__all__ = ["Flux2VAE", "Flux2VAEConfig", "load_flux2_vae", "patchify_latents",
           "unpatchify_latents"]
