"""LTX-2's video VAE (diffusers ``AutoencoderKLLTX2Video``: LTX-2, LTX-2.3) in Flax NNX.

A video ``[B, 3, F, H, W]`` in [-1, 1] with ``F = 8k + 1`` encodes to a diagonal Gaussian over
latents ``[B, 128, k + 1, H/32, W/32]`` (4x4 pixel patches, then spatial / temporal
space-to-depth levels; one log-variance channel shared by all latent channels) and decodes
back, optionally conditioned on a decode timestep. The encoder is causal in time (edge frames
repeated before the clip), the decoder not (both sides), as the config says; neither streams, so
long or large videos go through diffusers' tiles and overlapping clips (:mod:`.tiling`), one
compiled tile program at a time. Inside, activations are channels-last ``[B, F, Y, X, C]``.

Modules: ``config`` (:class:`LTX2VideoVAEConfig`: diffusers' names, resolved levels, factors,
rules), ``layers`` (causal conv, shortcut conv, RMS norm, buffers), ``shuffle`` (space ↔ depth,
patches), ``blocks`` (resnet, resamplers, level blocks, time embedder), ``coders`` (encoder,
decoder), ``tiling`` (:class:`Tiles`, tiled / clip-by-clip runs), ``model``
(:class:`LTX2VideoVAE`, the jitted programs), ``convert`` (the weight table,
:func:`load_ltx2_video_vae`). Module paths mirror the diffusers state-dict keys.
"""

from ditax.models.vae.ltx2.config import LTX2VideoVAEConfig
from ditax.models.vae.ltx2.convert import load_ltx2_video_vae
from ditax.models.vae.ltx2.model import LTX2VideoVAE
from ditax.models.vae.ltx2.tiling import Tiles

__all__ = ["LTX2VideoVAE", "LTX2VideoVAEConfig", "Tiles", "load_ltx2_video_vae"]
