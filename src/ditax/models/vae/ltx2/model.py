"""LTX-2's video VAE (diffusers ``AutoencoderKLLTX2Video``) as one NNX module: encode to the
diagonal-Gaussian posterior, decode (timestep-conditioned where the config says), tiled and
clip-by-clip versions of both, and the LTX-2 pipeline's latent normalisation and decode inputs.

Public tensors use diffusers' layout ``[B, C, F, H, W]``; inside everything is channels-last
``[B, F, Y, X, C]``. The jitted programs :func:`encode_program` / :func:`decode_program` are
pure functions of ``(graphdef, state, x)`` (``graphdef`` static), so one compiled program serves
every call of a shape, and a tiled call runs one tile per call of it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ditax.errors import RequestError
from ditax.models.vae.ltx2.coders import Decoder, Encoder
from ditax.models.vae.ltx2.config import LTX2VideoVAEConfig
from ditax.models.vae.ltx2.layers import Buffer
from ditax.models.vae.ltx2.tiling import (Tiles, decode_spatial, decode_temporal, encode_spatial,
                                          encode_temporal)

LOGVAR_RANGE = (-30.0, 20.0)   # diffusers' DiagonalGaussianDistribution clamp


@functools.partial(jax.jit, static_argnames=("graphdef",))
def encode_program(graphdef, state, x: jax.Array) -> jax.Array:
    """Video ``[B, F, H, W, c]`` → raw moments ``[B, F', Y, X, latent_channels + 1]``."""
    return nnx.merge(graphdef, state).moments(x)


@functools.partial(jax.jit, static_argnames=("graphdef",))
def decode_program(graphdef, state, z: jax.Array, timestep: jax.Array | None) -> jax.Array:
    """Latents ``[B, F', Y, X, latent_channels]`` (+ timestep ``[B]``) → unclipped video."""
    return nnx.merge(graphdef, state).decode_latents(z, timestep)


def split_moments(h: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Raw moments ``[..., C + 1]`` → (mean ``[..., C]``, log-variance clamped to [-30, 20]
    ``[..., C]``): diffusers repeats the encoder's last channel as every channel's log-variance."""
    mean, logvar = h[..., :-1], jnp.clip(h[..., -1:], *LOGVAR_RANGE)
    return mean, jnp.broadcast_to(logvar, mean.shape)


def _first(x) -> jax.Array:
    """``[B, F, H, W, C]`` (channels-last) → diffusers' ``[B, C, F, H, W]``."""
    return jnp.transpose(x, (0, 4, 1, 2, 3))


class LTX2VideoVAE(nnx.Module):
    """diffusers ``AutoencoderKLLTX2Video`` in Flax NNX (``dtype``: parameters and compute;
    norms in float32).

    ``encode`` returns the posterior mean (what the LTX-2 pipelines take, ``sample_mode=
    "argmax"``), ``sample`` a draw, ``encode_moments`` both moments; ``decode`` the video,
    unclipped as diffusers'. ``tiled=True`` is diffusers' ``enable_tiling()`` (spatial tiles of
    ``tiles``' sizes when the input is larger than one), ``framewise=True`` its
    ``use_framewise_decoding`` (overlapping clips in time when longer than one); both may be on.
    Latents are raw VAE latents; ``normalize_latents`` / ``denormalize_latents`` are the LTX-2
    pipeline's, :meth:`decode_inputs` its noising and timestep for a conditioned decoder.
    """

    def __init__(self, config: LTX2VideoVAEConfig, *, dtype=jnp.float32, rngs: nnx.Rngs):
        config.validate()
        self.config = config
        self.dtype = jnp.dtype(dtype)
        self.encoder = Encoder(config, dtype=dtype, rngs=rngs)
        self.decoder = Decoder(config, dtype=dtype, rngs=rngs)
        c = config.latent_channels
        self.latents_mean = Buffer(jnp.zeros((c,), jnp.float32))
        self.latents_std = Buffer(jnp.ones((c,), jnp.float32))

    # --- config views (diffusers' attribute names where the pipeline reads them)
    @property
    def latent_channels(self) -> int:
        return self.config.latent_channels

    @property
    def spatial_compression_ratio(self) -> int:
        """Pixels per latent pixel (32 for LTX-2)."""
        return self.config.spatial_factor

    @property
    def temporal_compression_ratio(self) -> int:
        """Frames per latent frame after the first (8 for LTX-2)."""
        return self.config.temporal_factor

    @property
    def timestep_conditioning(self) -> bool:
        return self.config.timestep_conditioning

    # --- traced pieces (channels-last; for jit, grad and trainers)
    def moments(self, x: jax.Array) -> jax.Array:
        """Video ``[B, F, H, W, c]`` → raw moments ``[B, F', Y, X, latent_channels + 1]``."""
        return self.encoder(x.astype(self.dtype))

    def decode_latents(self, z: jax.Array, timestep: jax.Array | None = None) -> jax.Array:
        """Latents ``[B, F', Y, X, latent_channels]`` → unclipped video ``[B, F, sY, sX, c]``;
        ``timestep`` ``[B]`` for a conditioned decoder (else None)."""
        return self.decoder(z.astype(self.dtype), timestep)

    # --- latent normalisation (LTX-2 pipeline convention)
    def _stats(self, z: jax.Array):
        shape = (1, self.latent_channels, 1, 1, 1)
        return (self.latents_mean[...].reshape(shape).astype(z.dtype),
                self.latents_std[...].reshape(shape).astype(z.dtype))

    def normalize_latents(self, z: jax.Array) -> jax.Array:
        """``(z - latents_mean) * scaling_factor / latents_std`` per channel; z ``[B, C, F, Y,
        X]``."""
        mean, std = self._stats(z)
        return (z - mean) * self.config.scaling_factor / std

    def standardize_latents(self, z: jax.Array) -> jax.Array:
        """``(z - latents_mean) / latents_std`` per channel, without ``scaling_factor``: how
        diffusers' image-to-video pipeline normalises its image's latent."""
        mean, std = self._stats(z)
        return (z - mean) / std

    def denormalize_latents(self, z: jax.Array) -> jax.Array:
        """Inverse of :meth:`normalize_latents`: ``z * latents_std / scaling_factor +
        latents_mean``."""
        mean, std = self._stats(z)
        return z * std / self.config.scaling_factor + mean

    def decode_inputs(self, latents: jax.Array, *, decode_timestep=0.0, decode_noise_scale=None,
                      noise: jax.Array | None = None, key: jax.Array | None = None):
        """The LTX-2 pipeline's last step before decoding: pipeline (normalised) latents
        ``[B, C, F, Y, X]`` → (raw latents for :meth:`decode`, its ``timestep``).

        A conditioned decoder gets ``timestep = decode_timestep`` (a number or one per sample)
        and latents ``(1 - s) latents + s noise`` first, ``s = decode_noise_scale`` (default:
        the timestep), ``noise`` given or drawn from ``key``. A decoder without conditioning
        gets the latents as they are and ``None``; a non-zero timestep or a noise scale is then
        an error (they would be ignored)."""
        b = latents.shape[0]
        if not self.timestep_conditioning:
            given = np.any(np.asarray(decode_timestep, np.float64) != 0)
            if given or decode_noise_scale is not None:
                raise RequestError(
                    f"decode_timestep={decode_timestep!r}, decode_noise_scale="
                    f"{decode_noise_scale!r}: this VAE has no timestep conditioning (config.json "
                    "timestep_conditioning=false); leave decode_timestep at 0 and "
                    "decode_noise_scale unset")
            return self.denormalize_latents(latents), None
        t = self._per_sample("decode_timestep", decode_timestep, b)
        s = t if decode_noise_scale is None else self._per_sample("decode_noise_scale",
                                                                  decode_noise_scale, b)
        if (noise is None) == (key is None):
            raise RequestError("decode_inputs: pass exactly one of noise= (an array like the "
                               "latents) or key= (a jax.random key to draw it)")
        if noise is None:
            noise = jax.random.normal(key, latents.shape, jnp.float32).astype(latents.dtype)
        elif tuple(noise.shape) != tuple(latents.shape):
            raise RequestError(f"decode_inputs: noise has shape {tuple(noise.shape)}, expected "
                               f"the latents' {tuple(latents.shape)}")
        s = s.astype(latents.dtype).reshape(b, 1, 1, 1, 1)
        return self.denormalize_latents((1 - s) * latents + s * noise), t

    @staticmethod
    def _per_sample(name: str, value, batch: int) -> jax.Array:
        v = jnp.asarray(value, jnp.float32)
        if v.ndim == 0:
            return jnp.full((batch,), v)
        if v.shape != (batch,):
            raise RequestError(f"{name} has shape {tuple(v.shape)}; give one number or one per "
                               f"sample ({batch})")
        return v

    # --- checks
    def _check_video(self, video) -> None:
        shape, c = tuple(video.shape), self.config.in_channels
        tf, sf = self.temporal_compression_ratio, self.spatial_compression_ratio
        where = "LTX2VideoVAE.encode"
        if len(shape) != 5:
            raise RequestError(f"{where}: expected video [B, {c}, F, H, W], got shape {shape} "
                               f"(rank {len(shape)}); add a batch axis or move channels to axis 1")
        if shape[1] != c:
            raise RequestError(f"{where}: expected {c} channels at axis 1, got shape {shape}; "
                               "videos are [B, C, F, H, W]")
        if shape[0] == 0 or shape[2] % tf != 1:
            raise RequestError(f"{where}: frame count {shape[2]} is not of the form {tf}k+1; use "
                               f"{shape[2] - (shape[2] - 1) % tf} or "
                               f"{shape[2] + (1 - shape[2]) % tf} frames")
        if 0 in shape[3:] or shape[3] % sf or shape[4] % sf:
            raise RequestError(f"{where}: height x width {shape[3]}x{shape[4]} must be positive "
                               f"multiples of {sf}; crop or resize the video")

    def _check_latents(self, z) -> None:
        shape, c = tuple(z.shape), self.latent_channels
        if len(shape) != 5 or shape[1] != c or 0 in shape:
            raise RequestError(f"LTX2VideoVAE.decode: expected latents [B, {c}, F, Y, X] with no "
                               f"empty axis, got shape {shape}; unpack the transformer's tokens "
                               f"[B, L, {c}] to [B, {c}, F, Y, X] first")

    def _timestep(self, timestep, batch: int) -> jax.Array | None:
        if not self.timestep_conditioning:
            if timestep is not None:
                raise RequestError("LTX2VideoVAE.decode: this VAE has no timestep conditioning "
                                   "(config.json timestep_conditioning=false); pass timestep=None")
            return None
        if timestep is None:
            raise RequestError("LTX2VideoVAE.decode: this VAE is timestep-conditioned "
                               "(config.json timestep_conditioning=true); pass timestep= (the "
                               "pipeline's decode_timestep, one number or one per sample; see "
                               "decode_inputs)")
        return self._per_sample("timestep", timestep, batch)

    # --- encode
    def encode_moments(self, video: jax.Array, *, tiled: bool = False, framewise: bool = False,
                       tiles: Tiles = Tiles()) -> tuple[jax.Array, jax.Array]:
        """Posterior (mean, log-variance clamped to [-30, 20]), each ``[B, latent_channels,
        1 + (F - 1) / tf, H/s, W/s]``, of a video ``[B, 3, F, H, W]`` in [-1, 1] with ``F = tf k
        + 1`` (tf = 8, s = 32 for LTX-2). ``tiled`` / ``framewise``: diffusers' tiled encodes
        when the video is larger / longer than one tile (:mod:`.tiling`)."""
        self._check_video(video)
        sf, tf = self.spatial_compression_ratio, self.temporal_compression_ratio
        if tiled or framewise:
            tiles.check(sf, tf, "LTX2VideoVAE.encode")
        x = jnp.transpose(jnp.asarray(video, self.dtype), (0, 2, 3, 4, 1))
        run = functools.partial(encode_program, *nnx.split(self))
        big = tiled and (x.shape[2] > tiles.tile_sample_min_height
                         or x.shape[3] > tiles.tile_sample_min_width)
        clip = (lambda v: encode_spatial(run, v, tiles, sf)) if big else run
        if framewise and x.shape[1] > tiles.tile_sample_min_num_frames:
            h = encode_temporal(clip, x, tiles, tf)
        else:
            h = clip(x)
        mean, logvar = split_moments(h)
        return _first(mean), _first(logvar)

    def encode(self, video: jax.Array, **tiling) -> jax.Array:
        """Posterior mean ``[B, latent_channels, F', Y, X]`` (keywords as
        :meth:`encode_moments`)."""
        return self.encode_moments(video, **tiling)[0]

    def sample(self, video: jax.Array, key: jax.Array, **tiling) -> jax.Array:
        """A posterior draw ``mean + exp(logvar / 2) * N(0, 1)``, shape as :meth:`encode`."""
        mean, logvar = self.encode_moments(video, **tiling)
        eps = jax.random.normal(key, mean.shape, jnp.float32).astype(mean.dtype)
        return mean + jnp.exp(0.5 * logvar) * eps

    # --- decode
    def decode(self, latents: jax.Array, timestep=None, *, tiled: bool = False,
               framewise: bool = False, tiles: Tiles = Tiles()) -> jax.Array:
        """Video ``[B, 3, 1 + tf (F - 1), sY, sX]`` (unclipped) from raw latents ``[B,
        latent_channels, F, Y, X]`` (apply :meth:`denormalize_latents`, or take
        :meth:`decode_inputs`' output, first). ``timestep``: one number or ``[B]``, required by
        a timestep-conditioned decoder and refused by another. ``tiled`` / ``framewise``:
        diffusers' tiled / clip-by-clip decodes (:mod:`.tiling`), each compiled tile program
        run one tile at a time."""
        self._check_latents(latents)
        t = self._timestep(timestep, latents.shape[0])
        sf, tf = self.spatial_compression_ratio, self.temporal_compression_ratio
        if tiled or framewise:
            tiles.check(sf, tf, "LTX2VideoVAE.decode")
        my, mx, mf = tiles.latent(sf, tf)[:3]
        z = jnp.transpose(jnp.asarray(latents, self.dtype), (0, 2, 3, 4, 1))
        graphdef, state = nnx.split(self)
        run = lambda v: decode_program(graphdef, state, v, t)  # noqa: E731

        def clip(v):
            if tiled and (v.shape[2] > my or v.shape[3] > mx):
                return decode_spatial(run, v, tiles, sf)
            return run(v)

        out = decode_temporal(clip, z, tiles, tf) if framewise and z.shape[1] > mf else clip(z)
        return _first(out)


__all__ = ["LTX2VideoVAE", "decode_program", "encode_program", "split_moments"]
