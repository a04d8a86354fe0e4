"""The image VAE (diffusers ``AutoencoderKL``; the FLUX.1 VAE and SD-style ones) as one NNX
module: encode to the diagonal-Gaussian posterior, decode, tiled versions of both, the latent
normalisation the Flux pipeline applies, and a differentiable autoencode for training.

Public tensors use diffusers' layout ``[B, C, H, W]``; inside everything is channels-last
``[B, H, W, C]``. The jitted programs :func:`encode_program` / :func:`decode_program` are pure
functions of ``(graphdef, state, x)`` (``graphdef`` static), so one compiled program serves
every call of a shape, and a tiled call runs one tile per call of it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.errors import RequestError
from ditax.models.vae.kl.coders import Decoder, Encoder
from ditax.models.vae.kl.config import FluxVAEConfig
from ditax.models.vae.kl.layers import Conv2d
from ditax.models.vae.kl.tiles import decode_tiled, encode_tiled

LOGVAR_RANGE = (-30.0, 20.0)   # diffusers' DiagonalGaussianDistribution clamp


@functools.partial(jax.jit, static_argnames=("graphdef",))
def encode_program(graphdef, state, x: jax.Array) -> jax.Array:
    """Image ``[B, H, W, C]`` → moments ``[B, Y, X, 2 latent_channels]`` (before the clamp)."""
    return nnx.merge(graphdef, state).moments(x)


@functools.partial(jax.jit, static_argnames=("graphdef",))
def decode_program(graphdef, state, z: jax.Array) -> jax.Array:
    """Latents ``[B, Y, X, latent_channels]`` → unclipped image ``[B, sY, sX, C]``."""
    return nnx.merge(graphdef, state).decode_latents(z)


def split_moments(h: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Moments ``[..., 2C]`` → (mean, log-variance clamped to [-30, 20]), each ``[..., C]``."""
    mean, logvar = jnp.split(h, 2, axis=-1)
    return mean, jnp.clip(logvar, *LOGVAR_RANGE)


class FluxVAE(nnx.Module):
    """diffusers ``AutoencoderKL`` in Flax NNX (``dtype``: parameters and compute; norms and
    the attention softmax in float32). ``attention``: the mid blocks' :func:`ditax.attention.attend`
    backend (``xla``, or ``blockwise`` to keep the ``[L, L]`` scores of a large tile out of memory).

    ``encode`` returns the posterior mean, ``sample`` a draw, ``encode_moments`` both moments;
    ``decode`` the image, unclipped as diffusers' ``decode``. ``tiled=True`` processes images
    larger than one tile (``sample_size`` pixels) in overlapping tiles as diffusers'
    ``enable_tiling()`` does. Latents are raw VAE latents; ``normalize_latents`` /
    ``denormalize_latents`` are the Flux pipeline's ``(z - shift) * scale`` and inverse.
    """

    def __init__(self, config: FluxVAEConfig, *, dtype=jnp.float32, rngs: nnx.Rngs,
                 attention: str = "xla"):
        self.setup(config, (config, config), dtype, rngs, attention)

    def setup(self, config, sides: tuple, dtype, rngs: nnx.Rngs, attention: str) -> None:
        """The parts every KL VAE has (FLUX.2's too): its validated ``config``, the encoder and
        decoder of ``sides`` (the :class:`FluxVAEConfig` of each) and the optional 1x1 quant
        convolutions around the latents."""
        config.validate()
        self.config = config
        self.dtype = jnp.dtype(dtype)
        z = config.latent_channels
        self.encoder = Encoder(sides[0], dtype=dtype, rngs=rngs, attention=attention)
        self.decoder = Decoder(sides[1], dtype=dtype, rngs=rngs, attention=attention)
        self.quant_conv = (Conv2d(2 * z, 2 * z, 1, dtype=dtype, rngs=rngs)
                           if config.use_quant_conv else None)
        self.post_quant_conv = (Conv2d(z, z, 1, dtype=dtype, rngs=rngs)
                                if config.use_post_quant_conv else None)

    # --- config views
    @property
    def latent_channels(self) -> int:
        return self.config.latent_channels

    @property
    def scale_factor_spatial(self) -> int:
        """Pixels per latent pixel (diffusers pipelines' ``vae_scale_factor``; 8 for FLUX.1)."""
        return self.config.spatial_factor

    # --- traced pieces (channels-last; for jit, grad and trainers)
    def moments(self, x: jax.Array) -> jax.Array:
        """Image ``[B, H, W, C]`` → moments ``[B, Y, X, 2 latent_channels]`` (before the clamp)."""
        h = self.encoder(x)
        return h if self.quant_conv is None else self.quant_conv(h)

    def decode_latents(self, z: jax.Array) -> jax.Array:
        """Latents ``[B, Y, X, latent_channels]`` → unclipped image ``[B, sY, sX, C]``."""
        if self.post_quant_conv is not None:
            z = self.post_quant_conv(z)
        return self.decoder(z)

    def autoencode(self, x: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Differentiable encode → posterior draw → decode of channels-last images ``x``
        ``[B, H, W, C]``: (unclipped reconstruction like ``x``, mean, log-variance
        ``[B, Y, X, latent_channels]``) — the training forward."""
        mean, logvar = split_moments(self.moments(x))
        eps = jax.random.normal(key, mean.shape, jnp.float32).astype(mean.dtype)
        return self.decode_latents(mean + jnp.exp(0.5 * logvar) * eps), mean, logvar

    # --- latent normalisation (Flux pipeline convention)
    def normalize_latents(self, z: jax.Array) -> jax.Array:
        """``(z - shift_factor) * scaling_factor`` (no shift when the config has none)."""
        shift = self.config.shift_factor or 0.0
        return (z - shift) * self.config.scaling_factor

    def denormalize_latents(self, z: jax.Array) -> jax.Array:
        """Inverse of :meth:`normalize_latents`: ``z / scaling_factor + shift_factor``."""
        shift = self.config.shift_factor or 0.0
        return z / self.config.scaling_factor + shift

    def _run(self, program, x, tiler, tile: int) -> jax.Array:
        """``program`` on ``x`` ``[B, C, H, W]`` made channels-last, in tiles through ``tiler``
        when one is given and ``x`` is larger than ``tile`` on a side (as diffusers decides)."""
        run = functools.partial(program, *nnx.split(self))
        x = jnp.transpose(jnp.asarray(x, self.dtype), (0, 2, 3, 1))
        return tiler(run, x, self.config) if tiler and max(x.shape[1:3]) > tile else run(x)

    # --- encode
    def _check_images(self, images) -> None:
        shape, c, s = tuple(images.shape), self.config.in_channels, self.scale_factor_spatial
        if len(shape) != 4:
            raise RequestError(f"FluxVAE.encode: expected images [B, {c}, H, W], got shape "
                               f"{shape} (rank {len(shape)}); add a batch axis or move channels "
                               "to axis 1")
        if shape[1] != c:
            raise RequestError(f"FluxVAE.encode: expected {c} channels at axis 1, got shape "
                               f"{shape}; images are [B, C, H, W]")
        if 0 in shape or shape[2] % s or shape[3] % s:
            raise RequestError(f"FluxVAE.encode: height x width {shape[2]}x{shape[3]} must be "
                               f"positive multiples of {s} (batch {shape[0]} non-empty); crop or "
                               "resize the images")

    def encode_moments(self, images: jax.Array, *, tiled: bool = False
                       ) -> tuple[jax.Array, jax.Array]:
        """Posterior (mean, log-variance clamped to [-30, 20]), each ``[B, latent_channels,
        H/s, W/s]``, of images ``[B, C, H, W]`` in [-1, 1]. ``tiled``: tiles of ``sample_size``
        pixels when the image is larger than one (diffusers' ``_tiled_encode``)."""
        self._check_images(images)
        h = self._run(encode_program, images, encode_tiled if tiled else None,
                      self.config.tile_sample_min_size)
        mean, logvar = split_moments(h)
        return jnp.transpose(mean, (0, 3, 1, 2)), jnp.transpose(logvar, (0, 3, 1, 2))

    def encode(self, images: jax.Array, *, tiled: bool = False) -> jax.Array:
        """Posterior mean ``[B, latent_channels, H/s, W/s]`` of images ``[B, C, H, W]``."""
        return self.encode_moments(images, tiled=tiled)[0]

    def sample(self, images: jax.Array, key: jax.Array, *, tiled: bool = False) -> jax.Array:
        """A posterior draw ``mean + exp(logvar / 2) * N(0, 1)``, shape as :meth:`encode`."""
        mean, logvar = self.encode_moments(images, tiled=tiled)
        eps = jax.random.normal(key, mean.shape, jnp.float32).astype(mean.dtype)
        return mean + jnp.exp(0.5 * logvar) * eps

    # --- decode
    def _check_latents(self, z) -> None:
        shape, c = tuple(z.shape), self.latent_channels
        if len(shape) != 4 or shape[1] != c or 0 in shape:
            raise RequestError(f"FluxVAE.decode: expected latents [B, {c}, Y, X] with no empty "
                               f"axis, got shape {shape}; unpack Flux's packed tokens "
                               f"[B, L, {4 * c}] to [B, {c}, Y, X] first")

    def decode(self, latents: jax.Array, *, tiled: bool = False) -> jax.Array:
        """Image ``[B, C, sY, sX]`` (unclipped) from raw latents ``[B, latent_channels, Y, X]``
        (apply :meth:`denormalize_latents` to pipeline latents first). ``tiled``: latent tiles
        of ``sample_size / s`` when the latents are larger than one (diffusers'
        ``tiled_decode``), one compiled tile program at a time."""
        self._check_latents(latents)
        out = self._run(decode_program, latents, decode_tiled if tiled else None,
                        self.config.tile_latent_min_size)
        return jnp.transpose(out, (0, 3, 1, 2))


__all__ = ["FluxVAE", "decode_program", "encode_program", "split_moments"]
