"""The Wan 2.1 / 2.2 video VAE (diffusers ``AutoencoderKLWan``) as one NNX module: encode,
decode, latent normalisation. Layers live in :mod:`.layers` / :mod:`.blocks` / :mod:`.residual` /
:mod:`.coders`, the jitted chunk steps in :mod:`.chunks`, tiled decoding in :mod:`.tiling`, the
2.2 VAE's pixel patches in :mod:`.shuffle`.
"""

from __future__ import annotations

import functools
from typing import Iterator

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.models.vae.wan.chunks import (TEMP_ACTIVATIONS, ChunkMemory, DecodePrograms,
                                         chunk_frames, compile_decode, device_of,
                                         encode_chunk, is_fast, jitted_decode, memory_budget,
                                         nbytes, resolve_path)
from ditax.models.vae.wan.coders import Decoder, Encoder
from ditax.models.vae.wan.config import WanVAEConfig
from ditax.models.vae.wan.layers import CausalConv3d, FastPath, fast_path, padded
from ditax.models.vae.wan.shuffle import patchify, unpatchify, video_pixels
from ditax.models.vae.wan.tiling import check_tiles, decode_tiled


class WanVAE(nnx.Module):
    """The Wan VAE: 2.1, or 2.2 (TI2V-5B) when ``config.is_residual``. Public tensors use the
    diffusers layout ``[B, C, F, H, W]``; the 2.2 VAE encodes ``patch_size`` x ``patch_size``
    pixel patches as channels (``patchify`` before the encoder, ``unpatchify`` after the decoder).

    ``encode`` returns the posterior mean, ``sample`` a posterior draw, ``decode`` the video
    clipped to [-1, 1]. ``normalize_latents`` / ``denormalize_latents`` apply the Wan pipeline's
    per-channel ``(z - mean) / std`` and its inverse.
    """

    def __init__(self, config: WanVAEConfig, *, dtype=jnp.float32, rngs: nnx.Rngs):
        config.validate()
        self.config = config
        self.dtype = jnp.dtype(dtype)
        z = config.z_dim
        self.encoder = Encoder(config, dtype=dtype, rngs=rngs)
        self.quant_conv = CausalConv3d(2 * z, 2 * z, 1, dtype=dtype, rngs=rngs)
        self.post_quant_conv = CausalConv3d(z, z, 1, dtype=dtype, rngs=rngs)
        self.decoder = Decoder(config, dtype=dtype, rngs=rngs)

    # --- config views
    @property
    def z_dim(self) -> int:
        return self.config.z_dim

    @property
    def latents_mean(self) -> list[float]:
        return list(self.config.latents_mean)

    @property
    def latents_std(self) -> list[float]:
        return list(self.config.latents_std)

    @property
    def scale_factor_temporal(self) -> int:
        return self.config.temporal_factor

    @property
    def scale_factor_spatial(self) -> int:
        return self.config.spatial_factor

    # --- latent normalisation (Wan pipeline convention)
    def _stats(self, z: jax.Array):
        if not self.config.latents_mean or not self.config.latents_std:
            raise ValueError("WanVAE: config has no latents_mean/latents_std; set them in config.json.")
        shape = (1, self.z_dim, 1, 1, 1)
        mean = jnp.asarray(self.config.latents_mean, jnp.float32).reshape(shape)
        std = jnp.asarray(self.config.latents_std, jnp.float32).reshape(shape)
        return mean.astype(z.dtype), std.astype(z.dtype)

    def normalize_latents(self, z: jax.Array) -> jax.Array:
        """``(z - latents_mean) / latents_std`` per channel. z ``[B, z_dim, F, Y, X]``."""
        mean, std = self._stats(z)
        return (z - mean) * (1.0 / std)

    def denormalize_latents(self, z: jax.Array) -> jax.Array:
        """Inverse of :meth:`normalize_latents`: ``z * latents_std + latents_mean``."""
        mean, std = self._stats(z)
        return z / (1.0 / std) + mean

    # --- encode
    def _check_video(self, video) -> None:
        shape = tuple(video.shape)
        c = self.config.video_channels
        tf, sf = self.scale_factor_temporal, self.scale_factor_spatial
        if len(shape) != 5:
            raise ValueError(f"WanVAE.encode: expected video [B, {c}, F, H, W], got shape {shape} "
                             f"(rank {len(shape)}); add a batch axis or move channels to axis 1.")
        if shape[1] != c:
            raise ValueError(f"WanVAE.encode: expected {c} channels at axis 1, got shape {shape}.")
        if shape[2] % tf != 1:
            raise ValueError(f"WanVAE.encode: frame count {shape[2]} is not of the form {tf}k+1; "
                             f"use {shape[2] - (shape[2] - 1) % tf} or {shape[2] + (1 - shape[2]) % tf} frames.")
        if shape[3] % sf or shape[4] % sf or shape[3] == 0 or shape[4] == 0:
            raise ValueError(f"WanVAE.encode: height x width {shape[3]}x{shape[4]} must be positive "
                             f"multiples of {sf}; crop or resize the video.")

    def encode_moments(self, video: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Posterior (mean, log-variance clipped to [-30, 20]), each ``[B, z_dim, F', Y, X]``.

        video ``[B, 3, F, H, W]`` in [-1, 1] with ``F = 4k + 1``; ``F' = k + 1``, ``Y = H/8``
        (``H/16`` for Wan 2.2). Processes the first frame, then 4 frames at a time, carrying the
        feature cache.
        """
        self._check_video(video)
        graphdef, state = nnx.split(self)
        x = jnp.transpose(jnp.asarray(video, self.dtype), (0, 2, 3, 4, 1))
        if self.config.patch_size:
            x = patchify(x, self.config.patch_size)
        h, cache = encode_chunk(graphdef, state, x[:, :1], None, first=True)
        outs = [h]
        tf = self.scale_factor_temporal
        for i in range(1, x.shape[1], tf):
            h, cache = encode_chunk(graphdef, state, x[:, i:i + tf], cache, first=False)
            outs.append(h)
        h = jnp.concatenate(outs, axis=1)
        mean, logvar = jnp.split(jnp.transpose(h, (0, 4, 1, 2, 3)), 2, axis=1)
        return mean, jnp.clip(logvar, -30.0, 20.0)

    def encode(self, video: jax.Array) -> jax.Array:
        """Posterior mean ``[B, z_dim, F', H/s, W/s]`` of video ``[B, 3, F, H, W]`` in [-1, 1]
        (``s`` = :attr:`scale_factor_spatial`)."""
        return self.encode_moments(video)[0]

    def sample(self, video: jax.Array, key: jax.Array) -> jax.Array:
        """A posterior draw ``mean + exp(logvar / 2) * N(0, 1)``, shape as :meth:`encode`."""
        mean, logvar = self.encode_moments(video)
        noise = jax.random.normal(key, mean.shape, jnp.float32).astype(mean.dtype)
        return mean + jnp.exp(0.5 * logvar) * noise

    # --- training
    def autoencode(self, x: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Differentiable encode → posterior draw → decode of channels-last video ``x``
        ``[B, F, H, W, C]`` (``C`` video channels, ``F = temporal_factor * k + 1``): returns
        (unclipped reconstruction like ``x``, mean, log-variance ``[B, F', Y, X, z_dim]``).

        The same streaming as :meth:`encode_moments` / :meth:`decode` (first frame, then
        ``temporal_factor`` frames per encoder chunk; one latent frame per decoder chunk, the
        causal cache carried), traced as one program for ``jax.grad``.
        """
        p, tf = self.config.patch_size, self.scale_factor_temporal
        if p:
            x = patchify(x, p)
        h, cache = self.encoder(x[:, :1], None, True)
        moments = [self.quant_conv(h)[0]]
        for i in range(1, x.shape[1], tf):
            h, cache = self.encoder(x[:, i:i + tf], cache, False)
            moments.append(self.quant_conv(h)[0])
        mean, logvar = jnp.split(jnp.concatenate(moments, axis=1), 2, axis=-1)
        logvar = jnp.clip(logvar, -30.0, 20.0)
        z = mean + jnp.exp(0.5 * logvar) * jax.random.normal(key, mean.shape, mean.dtype)
        z = self.post_quant_conv(z)[0]
        out, cache = self.decoder(z[:, :1], None, True)
        frames = [out]
        for i in range(1, z.shape[1]):
            out, cache = self.decoder(z[:, i:i + 1], cache, False)
            frames.append(out)
        video = jnp.concatenate(frames, axis=1)
        if p:
            video = unpatchify(video, p)
        return video, mean, logvar

    # --- decode
    def _check_latents(self, z) -> None:
        shape = tuple(z.shape)
        if len(shape) != 5 or shape[1] != self.z_dim or 0 in shape:
            raise ValueError(f"WanVAE.decode: expected latents [B, {self.z_dim}, F, Y, X] with no "
                             f"empty axis, got shape {shape}.")

    def chunk_memory(self, shape, cache) -> ChunkMemory:
        """A later decode chunk's memory on the fast path (:class:`.chunks.ChunkMemory`) for
        channels-last latents of ``shape`` ``[B, F, Y, X, z]`` in this module's dtype, given the
        first chunk's feature ``cache`` (arrays or ``jax.ShapeDtypeStruct`` s, or its bytes):
        the parameters, the cache, the decoded video, and per output frame
        :data:`.chunks.TEMP_ACTIVATIONS` activations of the decoder's top level (its channels
        padded) and the frame."""
        cfg, tf, s = self.config, self.scale_factor_temporal, self.dtype.itemsize
        pixels = shape[0] * shape[2] * shape[3] * (cfg.spatial_factor // (cfg.patch_size or 1)) ** 2
        with fast_path(FastPath()):
            width = padded((cfg.decoder_base_dim or cfg.base_dim) * cfg.dim_mult[0])
        frame = pixels * cfg.out_channels * s
        cache = cache if isinstance(cache, int) else nbytes(cache)
        fixed = nbytes(nnx.state(self)) + cache + self.video_bytes(shape)
        return ChunkMemory(fixed, tf * (TEMP_ACTIVATIONS * pixels * width * s + frame))

    def video_bytes(self, shape) -> int:
        """Bytes of the decoded (unclipped) video of channels-last latents of ``shape`` ``[B,
        F, Y, X, z]`` in this module's dtype."""
        cfg = self.config
        pixels = shape[0] * shape[2] * shape[3] * (cfg.spatial_factor // (cfg.patch_size or 1)) ** 2
        return self.frames_of(shape[1]) * pixels * cfg.out_channels * self.dtype.itemsize

    def plan_decode(self, shape, device=None, *, path: str = "auto", budget: int | None = None,
                    tiles: bool = False):
        """Whether decoding latents of ``shape`` ``[B, z_dim, F, Y, X]`` fits ``device``'s
        memory (``budget`` bytes; None: :func:`.chunks.memory_budget`), whole and (where that
        does not fit, or ``tiles``) in the spatial tiles of :meth:`decode`'s defaults:
        :func:`.fit.plan_decode`'s :class:`~.fit.DecodeFit`, from shapes alone (nothing runs)."""
        from ditax.models.vae.wan.fit import plan_decode

        return plan_decode(self, tuple(shape), device, path=path, budget=budget, tiles=tiles)

    def _chunk_frames(self, shape, path: str, frames: int | None, cache=None,
                      device=None) -> int:
        """Latent frames per later chunk for channels-last latents of ``shape``
        (:func:`.chunks.chunk_frames`); automatic ones on the fast path kept within
        ``device``'s :func:`.chunks.memory_budget` given the first chunk's ``cache``."""
        top = shape[2] * shape[3] * self.scale_factor_spatial ** 2
        fast = is_fast(path, device)
        memory = self.chunk_memory(shape, cache) if fast and cache is not None else None
        return chunk_frames(shape[1] - 1, top, fast, frames, memory,
                            None if memory is None else memory_budget(device))

    def _decode_frames(self, x: jax.Array, programs: DecodePrograms | None = None, *,
                       path: str = "auto", frames: int | None = None) -> jax.Array:
        """Unclipped decode of channels-last latents ``[B, F, Y, X, z]``: :meth:`_chunks`'
        frames joined."""
        return jnp.concatenate(list(self._chunks(x, programs, path=path, frames=frames)),
                               axis=1)

    def _chunks(self, x: jax.Array, programs: DecodePrograms | None = None, *,
                path: str = "auto", frames: int | None = None, post=None) -> Iterator[jax.Array]:
        """The unclipped channels-last frames ``[B, f, H, W, c]`` of each decode step of
        latents ``[B, F, Y, X, z]`` (``post``: a function of them, dispatched right behind its
        step and before the next, so a caller waiting for one chunk's result does not wait
        for the next step too), each yielded once the next step is dispatched (one step
        ahead: where dispatch is asynchronous, a TPU's, the device decodes the next while the
        caller takes these; where it is not, a CPU's, the caller's other threads still work
        on these while the next one decodes): the first latent frame, then chunks of
        ``programs.frames`` (else :meth:`_chunk_frames`'s, chosen once the first chunk's cache
        is known) latent frames, the last one padded with zero latents and its padding's
        frames cut (``programs``: :meth:`compile_decode`'s for this shape, else the jitted
        steps)."""
        graphdef, state = nnx.split(self)
        path = resolve_path(path, device_of(jax.tree.leaves(state)[0]))   # where it runs
        jitted = programs is None
        if jitted:   # the steps; their chunk length is chosen after the first
            programs = jitted_decode(graphdef, 1, path)
        left = self.frames_of(x.shape[1])       # frames still to yield

        def done(o):     # a step's frames, its padding's cut, then post
            nonlocal left
            o = o if o.shape[1] <= left else o[:, :left]
            left -= o.shape[1]
            return o if post is None else post(o)

        first, cache = programs.first(state, x[:, :1], None)
        out = done(first)
        n = (self._chunk_frames(x.shape, path, frames, cache, device_of(x)) if jitted
             else programs.frames)
        later = x.shape[1] - 1
        if later:
            rest = x[:, 1:]
            if later % n:
                rest = jnp.pad(rest, ((0, 0), (0, n - later % n), (0, 0), (0, 0), (0, 0)))
            for i in range(0, later, n):
                after, cache = programs.rest(state, rest[:, i:i + n], cache)
                yield out
                out = done(after)
        yield out

    def frames_of(self, latent_frames: int) -> int:
        """Video frames that ``latent_frames`` latent frames decode to."""
        return 1 + self.scale_factor_temporal * (latent_frames - 1)

    def compile_decode(self, shape, sharding=None, *, path: str = "auto",
                       frames_per_chunk: int | None = None) -> DecodePrograms:
        """Ahead-of-time compiled decode programs for latents of ``shape`` ``[B, z_dim, F, Y,
        X]`` (``sharding``: the latents'); pass them to :meth:`decode` as ``programs``.
        ``path`` / ``frames_per_chunk``: as :meth:`decode`'s."""
        b, z, f, y, x = shape
        lat, device = (b, f, y, x, z), device_of(sharding)
        path = resolve_path(path, device)
        choose = lambda cache: self._chunk_frames(lat, path, frames_per_chunk, cache, device)  # noqa: E731
        return compile_decode(*nnx.split(self), jax.ShapeDtypeStruct(lat, self.dtype, sharding=sharding),
                              frames=choose, path=path)

    def decode(self, z: jax.Array, *, tiled: bool = False, tile_sample_min: tuple[int, int] = (256, 256),
               tile_sample_stride: tuple[int, int] = (192, 192), programs=None, path: str = "auto",
               frames_per_chunk: int | None = None) -> jax.Array:
        """Video ``[B, 3, 1 + 4 (F - 1), sY, sX]`` in [-1, 1] from latents ``[B, z_dim, F, Y, X]``
        (``s`` = :attr:`scale_factor_spatial`: 8 for Wan 2.1, 16 for Wan 2.2).

        Latents are raw VAE latents (apply :meth:`denormalize_latents` first to pipeline
        latents). Decodes the first latent frame, then ``frames_per_chunk`` latent frames at a
        time with the feature cache carried over (None: 1 on the plain path, on the TPU fast
        path as many as keep a chunk near 16 frames of 480x832 and its program's estimated
        memory (:meth:`chunk_memory`) within 80% of the device's; every choice gives the same
        frames). ``path``: ``"auto"`` (the TPU fast path on a TPU: Pallas convolutions, channels
        padded to 128, their taps packed; XLA's convolutions elsewhere), ``"plain"``,
        ``"fast"``, ``"interpret"``, ``"packed"`` or ``"interpret-packed"`` (see :mod:`.chunks`), or a
        :class:`~.layers.FastPath` (diagnosis: its packing restricted to some channel counts).
        ``tiled=True`` decodes overlapping spatial tiles of ``tile_sample_min`` pixels (height,
        width) every ``tile_sample_stride`` pixels and blends the overlaps linearly, as diffusers'
        ``tiled_decode``; it only takes effect when the latent is larger than one tile.
        ``programs``: :meth:`compile_decode`'s for ``z``'s shape (untiled decodes only).
        """
        self._check_latents(z)
        x = jnp.transpose(jnp.asarray(z, self.dtype), (0, 2, 3, 4, 1))
        sf, p = self.scale_factor_spatial, self.config.patch_size or 1
        tile_lat = (tile_sample_min[0] // sf, tile_sample_min[1] // sf)
        if tiled and (x.shape[2] > tile_lat[0] or x.shape[3] > tile_lat[1]):
            check_tiles(tile_sample_min, tile_sample_stride, sf)
            # tiles are blended on the decoder's output, before unpatchify: 1/p the pixels
            decode = functools.partial(self._decode_frames, path=path, frames=frames_per_chunk)
            video = decode_tiled(decode, x, tuple(t // p for t in tile_sample_min),
                                 tuple(t // p for t in tile_sample_stride), sf // p)
        else:
            video = self._decode_frames(x, programs, path=path, frames=frames_per_chunk)
        return video_pixels(video, p)

    def decode_chunks(self, z: jax.Array, *, programs=None, path: str = "auto",
                      frames_per_chunk: int | None = None) -> Iterator[jax.Array]:
        """:meth:`decode`'s video (untiled) as the frames of each decode step: ``[B, 3, f,
        sY, sX]`` in [-1, 1] a step, the first latent frame's one frame, then each chunk's
        (:meth:`frames_of` in all; arguments: :meth:`decode`'s). Each is yielded once the
        next step is dispatched, so a caller that takes the frames in order (an mp4 encoder
        on a thread) works on them while the next step decodes; joined on the frame axis they
        are :meth:`decode`'s values."""
        self._check_latents(z)
        x = jnp.transpose(jnp.asarray(z, self.dtype), (0, 2, 3, 4, 1))
        p = self.config.patch_size or 1
        # each step's pixels dispatched behind it: a caller taking a chunk's frames waits
        # for that step only, and works on them while the next decodes (behind the next
        # step, the device idled through every chunk's host work: 0.66 s at 480x832x81)
        yield from self._chunks(x, programs, path=path, frames=frames_per_chunk,
                                post=lambda v: video_pixels(v, p))


__all__ = ["WanVAE"]
