"""diffusers' ``AutoencoderKL`` in Flax NNX: FLUX.1's image VAE (hence the class names); SD-style
``AutoencoderKL`` folders (quant convs, 4 latent channels, no shift) load through it too.

An image ``[B, 3, H, W]`` in [-1, 1] encodes to a diagonal Gaussian over latents
``[B, latent_channels, H/8, W/8]`` (FLUX.1: 16 channels; 8 = 2 per level but the last) and
decodes back. Inside, activations are channels-last ``[B, Y, X, C]``; the public methods take
and return diffusers' ``[B, C, H, W]``. Large images (2048²) encode / decode in overlapping
tiles with diffusers' tile arithmetic, one compiled tile program at a time.

Modules: ``config`` (:class:`FluxVAEConfig`: diffusers' config names, factors, tile sizes),
``layers`` (2-D conv, GroupNorm), ``blocks`` (resnet, attention, resamplers, the encoder's /
decoder's level blocks, the mid block), ``coders`` (encoder, decoder), ``tiles`` (tiled
encode / decode), ``model`` (:class:`FluxVAE`, the jitted programs), ``convert`` (the weights
table, :func:`load_vae`). Module paths mirror the diffusers state-dict keys.
"""

from ditax.models.vae.kl.config import FluxVAEConfig
from ditax.models.vae.kl.convert import load_vae
from ditax.models.vae.kl.model import FluxVAE

__all__ = ["FluxVAE", "FluxVAEConfig", "load_vae"]
