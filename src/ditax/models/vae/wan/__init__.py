"""Wan video VAE (diffusers ``AutoencoderKLWan``) in Flax NNX.

The VAE compresses a video ``[B, 3, F, H, W]`` (values in [-1, 1], ``F = 4k + 1``) into latents
``[B, z_dim, k + 1, H/8, W/8]`` and back (4 and 8 are ``WanVAEConfig.temporal_factor`` /
``spatial_factor``). Time is handled causally: every 3-D convolution sees only the current and
earlier frames, so a video can be processed in chunks (encoder: the first frame, then 4 frames
at a time; decoder: the first latent frame, then any number of latent frames at a time) while
carrying a *feature cache*: the last two
input frames of every temporal convolution. The result is identical to processing the whole
video at once with the reference's chunking, and memory does not grow with the number of frames.

Internally activations are channels-last ``[B, F, Y, X, C]``; the public methods take and return
the diffusers layout ``[B, C, F, Y, X]``. The cache is a pytree of arrays (``None`` for layers
without temporal context), so one jitted step function serves every chunk after the first.

The Wan 2.2 TI2V-5B VAE (``is_residual=True, patch_size=2``) encodes 2x2 pixel patches as
channels (16x spatial, 48 latent channels) and builds every level as one residual block with a
parameter-free shortcut (average-pooled down / duplicated up); chunking and cache are the same.

Module attribute paths mirror the diffusers state-dict keys (see ``convert.py``); the one
rename is ``resample_conv`` for diffusers' ``resample.1`` (the conv inside an ``nn.Sequential``).

On a TPU the decoder takes a fast path (``WanVAE.decode(path="auto")``): channels padded to
multiples of 128, its 3x3 convolutions as Pallas kernels with the following norm / residual
fused (``conv_tpu``), nearest upsampling folded into the next convolution, and several latent
frames per chunk (``frames_per_chunk``); it decodes the same frames.

Modules: ``config`` (shape and factors), ``layers`` (convolutions, norm, the fast path's
switch), ``conv_tpu`` (the TPU convolution kernel), ``blocks`` (residual, attention,
resampling, mid/up blocks), ``residual`` (the 2.2 levels), ``shuffle`` (patches and the 2.2
shortcuts), ``coders`` (encoder, decoder), ``chunks`` (the jitted chunk steps, the decode's
chunking), ``tiling`` (tiled decode), ``fit`` (whether a decode fits a device, whole or in
tiles, planned from shapes), ``model`` (:class:`WanVAE`), ``convert`` (the weight table,
:func:`~ditax.models.vae.wan.convert.load_vae`).
"""

from ditax.models.vae.wan.config import WanVAEConfig
from ditax.models.vae.wan.model import WanVAE

__all__ = ["WanVAE", "WanVAEConfig"]
