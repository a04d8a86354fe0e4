"""Wan 2.1 video VAE (diffusers ``AutoencoderKLWan``) in Flax NNX.

The VAE compresses a video ``[B, 3, F, H, W]`` (values in [-1, 1], ``F = 4k + 1``) into latents
``[B, z_dim, k + 1, H/8, W/8]`` and back. Time is handled causally: every 3-D convolution sees
only the current and earlier frames, so a video can be processed in chunks (encoder: the first
frame, then 4 frames at a time; decoder: one latent frame at a time) while carrying a *feature
cache*: the last two input frames of every temporal convolution. The result is identical to
processing the whole video at once with the reference's chunking, and memory does not grow with
the number of frames.

Internally activations are channels-last ``[B, F, Y, X, C]``; the public methods take and return
the diffusers layout ``[B, C, F, Y, X]``. The cache is a pytree of arrays (``None`` for layers
without temporal context), so one jitted step function serves every chunk after the first.

Module attribute paths mirror the diffusers state-dict keys (see ``vae_convert.py``); the one
rename is ``resample_conv`` for diffusers' ``resample.1`` (the conv inside an ``nn.Sequential``).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

log = logging.getLogger(__name__)

CACHE_FRAMES = 2  # frames of left context kept per causal conv (diffusers CACHE_T)

Cache = Any  # nested dict/list of arrays [B, frames, Y, X, C] or None


@dataclass(frozen=True)
class WanVAEConfig:
    """Shape of the VAE; field names follow diffusers' ``AutoencoderKLWan`` config."""

    base_dim: int = 96
    decoder_base_dim: int | None = None
    z_dim: int = 16
    dim_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    attn_scales: tuple[float, ...] = ()
    temperal_downsample: tuple[bool, ...] = (False, True, True)
    dropout: float = 0.0
    latents_mean: tuple[float, ...] = ()
    latents_std: tuple[float, ...] = ()
    is_residual: bool = False
    in_channels: int = 3
    out_channels: int = 3
    patch_size: int | None = None
    scale_factor_temporal: int | None = 4
    scale_factor_spatial: int | None = 8

    @classmethod
    def from_diffusers(cls, cfg: dict) -> "WanVAEConfig":
        """Build from a diffusers ``config.json`` dict; unknown keys are logged and ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(k for k in cfg if k not in names and not k.startswith("_"))
        if unknown:
            log.warning("WanVAE config: ignoring unknown keys %s", unknown)
        kw = {}
        for k in names & cfg.keys():
            v = cfg[k]
            kw[k] = tuple(v) if isinstance(v, list) else v
        c = cls(**kw)
        c.validate()
        return c

    def validate(self) -> None:
        """Reject configurations this port does not implement, with the reason and the fix."""
        if self.is_residual or self.patch_size not in (None, 1):
            raise NotImplementedError(
                f"WanVAE: is_residual={self.is_residual}, patch_size={self.patch_size} is the Wan 2.2 "
                "TI2V-5B VAE, which ditax does not implement; use the Wan 2.1 VAE (is_residual=false, "
                "patch_size=null), which Wan 2.1 and Wan 2.2 T2V-A14B use.")
        if self.attn_scales:
            raise NotImplementedError(
                f"WanVAE: attn_scales={list(self.attn_scales)} is not supported (diffusers' encoder "
                "cannot run it either); use attn_scales=[]. The mid-block attention is always present.")
        if len(self.temperal_downsample) != len(self.dim_mult) - 1:
            raise ValueError(
                f"WanVAE: temperal_downsample has {len(self.temperal_downsample)} entries, expected "
                f"len(dim_mult) - 1 = {len(self.dim_mult) - 1}.")
        for name in ("latents_mean", "latents_std"):
            v = getattr(self, name)
            if v and len(v) != self.z_dim:
                raise ValueError(f"WanVAE: {name} has {len(v)} entries, expected z_dim={self.z_dim}.")

    @property
    def temporal_factor(self) -> int:
        """Frames per latent frame implied by the architecture (4 for Wan 2.1)."""
        return 2 ** sum(bool(t) for t in self.temperal_downsample)

    @property
    def spatial_factor(self) -> int:
        """Pixels per latent pixel implied by the architecture (8 for Wan 2.1)."""
        return 2 ** (len(self.dim_mult) - 1)


# ----------------------------------------------------------------------------- layers


def _triple(v) -> tuple[int, int, int]:
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v, v)


def _init(rngs: nnx.Rngs, shape, fan_in: int, dtype) -> nnx.Param:
    return nnx.Param(jax.random.normal(rngs.params(), shape, jnp.float32).astype(dtype) / math.sqrt(fan_in))


class CausalConv3d(nnx.Module):
    """3-D convolution that is causal in time: ``2 * padding_t`` frames of left context.

    The left context comes from ``cache`` (the previous chunk's last input frames) or, at the
    start of the stream (``cache=None``), zeros. Spatial padding is symmetric zeros.
    weight ``[kt, kh, kw, C_in, C_out]``, bias ``[C_out]``.
    """

    def __init__(self, cin: int, cout: int, kernel, stride=1, padding=0, *, dtype, rngs: nnx.Rngs):
        kernel, stride, padding = _triple(kernel), _triple(stride), _triple(padding)
        self.stride = stride
        self.context = 2 * padding[0]
        self.pad_yx = (padding[1], padding[2])
        self.weight = _init(rngs, (*kernel, cin, cout), cin * math.prod(kernel), dtype)
        self.bias = nnx.Param(jnp.zeros((cout,), dtype))

    def conv(self, x: jax.Array) -> jax.Array:
        """Plain convolution with no temporal padding. x ``[B, F, Y, X, C]``."""
        py, px = self.pad_yx
        y = jax.lax.conv_general_dilated(
            x, self.weight[...], window_strides=self.stride, padding=[(0, 0), (py, py), (px, px)],
            dimension_numbers=("NDHWC", "DHWIO", "NDHWC"))
        return y + self.bias[...]

    def __call__(self, x: jax.Array, cache: jax.Array | None = None):
        """x ``[B, F, Y, X, C]``, cache ``[B, context, Y, X, C]`` or None → (y, new cache)."""
        if not self.context:
            return self.conv(x), None
        if cache is None:
            cache = jnp.zeros((x.shape[0], self.context, *x.shape[2:]), x.dtype)
        xc = jnp.concatenate([cache.astype(x.dtype), x], axis=1)
        return self.conv(xc), xc[:, -self.context:]


class Conv2d(nnx.Module):
    """Per-frame 2-D convolution. weight ``[kh, kw, C_in, C_out]``, bias ``[C_out]``."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, padding, *, dtype, rngs):
        self.stride = (stride, stride)
        self.padding = padding  # ((top, bottom), (left, right))
        self.weight = _init(rngs, (kernel, kernel, cin, cout), cin * kernel * kernel, dtype)
        self.bias = nnx.Param(jnp.zeros((cout,), dtype))

    def __call__(self, x: jax.Array) -> jax.Array:
        """x ``[B, F, Y, X, C]`` → ``[B, F, Y', X', C_out]``."""
        b, f = x.shape[:2]
        y = jax.lax.conv_general_dilated(
            x.reshape(b * f, *x.shape[2:]), self.weight[...], window_strides=self.stride,
            padding=self.padding, dimension_numbers=("NHWC", "HWIO", "NHWC"))
        y = y + self.bias[...]
        return y.reshape(b, f, *y.shape[1:])


class Dense(nnx.Module):
    """Pointwise projection (diffusers' 1x1 ``Conv2d``). weight ``[C_in, C_out]``."""

    def __init__(self, cin: int, cout: int, *, dtype, rngs):
        self.weight = _init(rngs, (cin, cout), cin, dtype)
        self.bias = nnx.Param(jnp.zeros((cout,), dtype))

    def __call__(self, x: jax.Array) -> jax.Array:
        return x @ self.weight[...] + self.bias[...]


class RMSNorm(nnx.Module):
    """Channel L2 normalisation times ``sqrt(C) * gamma`` (diffusers ``WanRMS_norm``, no bias).

    Normalises in float32 (eps 1e-12 on the norm, like ``F.normalize``). x ``[..., C]``.
    """

    def __init__(self, dim: int, *, dtype):
        self.scale = dim ** 0.5
        self.gamma = nnx.Param(jnp.ones((dim,), dtype))

    def __call__(self, x: jax.Array) -> jax.Array:
        xf = x.astype(jnp.float32)
        norm = jnp.sqrt(jnp.sum(xf * xf, axis=-1, keepdims=True))
        y = (xf / jnp.maximum(norm, 1e-12)).astype(x.dtype)
        return y * self.scale * self.gamma[...]


class ResidualBlock(nnx.Module):
    """norm → SiLU → causal conv → norm → SiLU → causal conv, plus a (1x1x1 conv) shortcut."""

    def __init__(self, cin: int, cout: int, *, dtype, rngs):
        self.norm1 = RMSNorm(cin, dtype=dtype)
        self.conv1 = CausalConv3d(cin, cout, 3, padding=1, dtype=dtype, rngs=rngs)
        self.norm2 = RMSNorm(cout, dtype=dtype)
        self.conv2 = CausalConv3d(cout, cout, 3, padding=1, dtype=dtype, rngs=rngs)
        self.conv_shortcut = CausalConv3d(cin, cout, 1, dtype=dtype, rngs=rngs) if cin != cout else None

    def __call__(self, x: jax.Array, cache: Cache = None):
        """x ``[B, F, Y, X, C_in]`` → (``[B, F, Y, X, C_out]``, cache)."""
        cache = cache or {}
        h = x if self.conv_shortcut is None else self.conv_shortcut(x)[0]
        y, c1 = self.conv1(jax.nn.silu(self.norm1(x)), cache.get("conv1"))
        y, c2 = self.conv2(jax.nn.silu(self.norm2(y)), cache.get("conv2"))
        return y + h, {"conv1": c1, "conv2": c2}


class AttentionBlock(nnx.Module):
    """Single-head self-attention over the pixels of each frame (no temporal mixing)."""

    def __init__(self, dim: int, *, dtype, rngs):
        self.norm = RMSNorm(dim, dtype=dtype)
        self.to_qkv = Dense(dim, 3 * dim, dtype=dtype, rngs=rngs)
        self.proj = Dense(dim, dim, dtype=dtype, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        """x ``[B, F, Y, X, C]`` → same shape; softmax in float32."""
        b, f, yy, xx, c = x.shape
        q, k, v = jnp.split(self.to_qkv(self.norm(x)).reshape(b * f, yy * xx, 3 * c), 3, axis=-1)
        s = jnp.einsum("blc,bmc->blm", q, k, preferred_element_type=jnp.float32) / math.sqrt(c)
        p = jax.nn.softmax(s, axis=-1).astype(v.dtype)
        o = jnp.einsum("blm,bmc->blc", p, v)
        return x + self.proj(o).reshape(b, f, yy, xx, c)


class Resample(nnx.Module):
    """2x spatial up/down-sampling, optionally with 2x temporal up/down-sampling.

    modes: ``upsample2d`` / ``upsample3d`` (nearest 2x then 3x3 conv to ``out_dim``; 3d first
    doubles frames with a causal time conv to 2C channels, skipped on the first chunk so frame 0
    stays one frame), ``downsample2d`` / ``downsample3d`` (pad right/bottom by one, 3x3 conv with
    stride 2; 3d then halves frames with a stride-2 time conv over [previous frame, chunk],
    skipped on the first chunk).
    """

    def __init__(self, dim: int, mode: str, out_dim: int | None = None, *, dtype, rngs):
        self.mode = mode
        if mode.startswith("upsample"):
            self.resample_conv = Conv2d(dim, out_dim or dim // 2, 3, 1, ((1, 1), (1, 1)), dtype=dtype, rngs=rngs)
        elif mode.startswith("downsample"):
            self.resample_conv = Conv2d(dim, dim, 3, 2, ((0, 1), (0, 1)), dtype=dtype, rngs=rngs)
        else:
            raise ValueError(f"Resample: unknown mode {mode!r}")
        if mode == "upsample3d":
            self.time_conv = CausalConv3d(dim, 2 * dim, (3, 1, 1), padding=(1, 0, 0), dtype=dtype, rngs=rngs)
        elif mode == "downsample3d":
            self.time_conv = CausalConv3d(dim, dim, (3, 1, 1), stride=(2, 1, 1), dtype=dtype, rngs=rngs)
        else:
            self.time_conv = None

    def __call__(self, x: jax.Array, cache: Cache, first: bool):
        """x ``[B, F, Y, X, C]`` → (resampled x, cache); ``first`` marks the first chunk."""
        new_cache = None
        if self.mode == "upsample3d":
            b, f, yy, xx, c = x.shape
            if first:
                new_cache = jnp.zeros((b, CACHE_FRAMES, yy, xx, c), x.dtype)
            else:
                y, new_cache = self.time_conv(x, cache)
                # channel halves (h0, h1) of frame i become frames 2i, 2i+1
                x = y.reshape(b, f, yy, xx, 2, c).transpose(0, 1, 4, 2, 3, 5).reshape(b, 2 * f, yy, xx, c)
        if self.mode.startswith("upsample"):
            x = jnp.repeat(jnp.repeat(x, 2, axis=2), 2, axis=3)
        x = self.resample_conv(x)
        if self.mode == "downsample3d":
            if first:
                new_cache = x[:, -1:]
            else:
                new_cache = x[:, -1:]
                x = self.time_conv.conv(jnp.concatenate([cache.astype(x.dtype), x], axis=1))
        return x, new_cache


class MidBlock(nnx.Module):
    """resnet → attention → resnet at the lowest resolution."""

    def __init__(self, dim: int, *, dtype, rngs):
        self.resnets = nnx.List([ResidualBlock(dim, dim, dtype=dtype, rngs=rngs) for _ in range(2)])
        self.attentions = nnx.List([AttentionBlock(dim, dtype=dtype, rngs=rngs)])

    def __call__(self, x: jax.Array, cache: Cache = None):
        cache = cache or [None, None]
        x, c0 = self.resnets[0](x, cache[0])
        x = self.attentions[0](x)
        x, c1 = self.resnets[1](x, cache[1])
        return x, [c0, c1]


class Encoder(nnx.Module):
    """Video ``[B, F, H, W, 3]`` → ``[B, F', H/8, W/8, 2 z_dim]`` (mean and log-variance)."""

    def __init__(self, cfg: WanVAEConfig, *, dtype, rngs):
        dims = [cfg.base_dim * u for u in (1, *cfg.dim_mult)]
        self.conv_in = CausalConv3d(cfg.in_channels, dims[0], 3, padding=1, dtype=dtype, rngs=rngs)
        blocks = []
        for i, (cin, cout) in enumerate(zip(dims[:-1], dims[1:])):
            for _ in range(cfg.num_res_blocks):
                blocks.append(ResidualBlock(cin, cout, dtype=dtype, rngs=rngs))
                cin = cout
            if i != len(cfg.dim_mult) - 1:
                mode = "downsample3d" if cfg.temperal_downsample[i] else "downsample2d"
                blocks.append(Resample(cout, mode, dtype=dtype, rngs=rngs))
        self.down_blocks = nnx.List(blocks)
        self.mid_block = MidBlock(dims[-1], dtype=dtype, rngs=rngs)
        self.norm_out = RMSNorm(dims[-1], dtype=dtype)
        self.conv_out = CausalConv3d(dims[-1], 2 * cfg.z_dim, 3, padding=1, dtype=dtype, rngs=rngs)

    def __call__(self, x: jax.Array, cache: Cache, first: bool):
        cache = cache or {"down_blocks": [None] * len(self.down_blocks)}
        x, c_in = self.conv_in(x, cache.get("conv_in"))
        c_down = []
        for layer, c in zip(self.down_blocks, cache["down_blocks"]):
            x, c = layer(x, c, first) if isinstance(layer, Resample) else layer(x, c)
            c_down.append(c)
        x, c_mid = self.mid_block(x, cache.get("mid_block"))
        x, c_out = self.conv_out(jax.nn.silu(self.norm_out(x)), cache.get("conv_out"))
        return x, {"conv_in": c_in, "down_blocks": c_down, "mid_block": c_mid, "conv_out": c_out}


class UpBlock(nnx.Module):
    """``num_res_blocks + 1`` residual blocks, then an optional upsampler."""

    def __init__(self, cin: int, cout: int, num_res_blocks: int, mode: str | None, *, dtype, rngs):
        res = []
        for _ in range(num_res_blocks + 1):
            res.append(ResidualBlock(cin, cout, dtype=dtype, rngs=rngs))
            cin = cout
        self.resnets = nnx.List(res)
        self.upsamplers = nnx.List([Resample(cout, mode, dtype=dtype, rngs=rngs)]) if mode else None

    def __call__(self, x: jax.Array, cache: Cache, first: bool):
        cache = cache or {"resnets": [None] * len(self.resnets)}
        c_res = []
        for layer, c in zip(self.resnets, cache["resnets"]):
            x, c = layer(x, c)
            c_res.append(c)
        c_up = None
        if self.upsamplers is not None:
            x, c_up = self.upsamplers[0](x, cache.get("upsampler"), first)
        return x, {"resnets": c_res, "upsampler": c_up}


class Decoder(nnx.Module):
    """Latent ``[B, F', Y, X, z_dim]`` → video ``[B, 1 + 4 (F' - 1), 8Y, 8X, 3]`` (unclipped)."""

    def __init__(self, cfg: WanVAEConfig, *, dtype, rngs):
        base = cfg.decoder_base_dim or cfg.base_dim
        mult = cfg.dim_mult
        dims = [base * u for u in (mult[-1], *mult[::-1])]
        temperal_upsample = cfg.temperal_downsample[::-1]
        self.conv_in = CausalConv3d(cfg.z_dim, dims[0], 3, padding=1, dtype=dtype, rngs=rngs)
        self.mid_block = MidBlock(dims[0], dtype=dtype, rngs=rngs)
        blocks = []
        for i, (cin, cout) in enumerate(zip(dims[:-1], dims[1:])):
            if i > 0:
                cin //= 2  # the previous upsampler's 2-D conv halves the channels
            mode = None
            if i != len(mult) - 1:
                mode = "upsample3d" if temperal_upsample[i] else "upsample2d"
            blocks.append(UpBlock(cin, cout, cfg.num_res_blocks, mode, dtype=dtype, rngs=rngs))
        self.up_blocks = nnx.List(blocks)
        self.norm_out = RMSNorm(dims[-1], dtype=dtype)
        self.conv_out = CausalConv3d(dims[-1], cfg.out_channels, 3, padding=1, dtype=dtype, rngs=rngs)

    def __call__(self, x: jax.Array, cache: Cache, first: bool):
        cache = cache or {"up_blocks": [None] * len(self.up_blocks)}
        x, c_in = self.conv_in(x, cache.get("conv_in"))
        x, c_mid = self.mid_block(x, cache.get("mid_block"))
        c_up = []
        for block, c in zip(self.up_blocks, cache["up_blocks"]):
            x, c = block(x, c, first)
            c_up.append(c)
        x, c_out = self.conv_out(jax.nn.silu(self.norm_out(x)), cache.get("conv_out"))
        return x, {"conv_in": c_in, "mid_block": c_mid, "up_blocks": c_up, "conv_out": c_out}


# ----------------------------------------------------------------------------- chunk steps
# Pure functions of (graphdef, state, chunk, cache), jitted once per (shape, first) and reused
# for every chunk; graphdef is static (hashable), the cache is an ordinary pytree argument and is
# donated, so the new cache can reuse its buffers (peak memory: one cache, not two).


@functools.partial(jax.jit, static_argnames=("graphdef", "first"), donate_argnames=("cache",))
def _encode_chunk(graphdef, state, x, cache, *, first: bool):
    vae = nnx.merge(graphdef, state)
    h, cache = vae.encoder(x, cache, first)
    return vae.quant_conv(h)[0], cache


@functools.partial(jax.jit, static_argnames=("graphdef", "first"), donate_argnames=("cache",))
def _decode_chunk(graphdef, state, z, cache, *, first: bool):
    vae = nnx.merge(graphdef, state)
    x = vae.post_quant_conv(z)[0]
    return vae.decoder(x, cache, first)


# ----------------------------------------------------------------------------- model


class WanVAE(nnx.Module):
    """The Wan 2.1 VAE. Public tensors use the diffusers layout ``[B, C, F, H, W]``.

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
        c = self.config.in_channels
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

        video ``[B, 3, F, H, W]`` in [-1, 1] with ``F = 4k + 1``; ``F' = k + 1``, ``Y = H/8``.
        Processes the first frame, then 4 frames at a time, carrying the feature cache.
        """
        self._check_video(video)
        graphdef, state = nnx.split(self)
        x = jnp.transpose(jnp.asarray(video, self.dtype), (0, 2, 3, 4, 1))
        h, cache = _encode_chunk(graphdef, state, x[:, :1], None, first=True)
        outs = [h]
        tf = self.scale_factor_temporal
        for i in range(1, x.shape[1], tf):
            h, cache = _encode_chunk(graphdef, state, x[:, i:i + tf], cache, first=False)
            outs.append(h)
        h = jnp.concatenate(outs, axis=1)
        mean, logvar = jnp.split(jnp.transpose(h, (0, 4, 1, 2, 3)), 2, axis=1)
        return mean, jnp.clip(logvar, -30.0, 20.0)

    def encode(self, video: jax.Array) -> jax.Array:
        """Posterior mean ``[B, z_dim, F', H/8, W/8]`` of video ``[B, 3, F, H, W]`` in [-1, 1]."""
        return self.encode_moments(video)[0]

    def sample(self, video: jax.Array, key: jax.Array) -> jax.Array:
        """A posterior draw ``mean + exp(logvar / 2) * N(0, 1)``, shape as :meth:`encode`."""
        mean, logvar = self.encode_moments(video)
        noise = jax.random.normal(key, mean.shape, jnp.float32).astype(mean.dtype)
        return mean + jnp.exp(0.5 * logvar) * noise

    # --- decode
    def _check_latents(self, z) -> None:
        shape = tuple(z.shape)
        if len(shape) != 5 or shape[1] != self.z_dim or 0 in shape:
            raise ValueError(f"WanVAE.decode: expected latents [B, {self.z_dim}, F, Y, X] with no "
                             f"empty axis, got shape {shape}.")

    def _decode_frames(self, x: jax.Array) -> jax.Array:
        """Unclipped decode of channels-last latents ``[B, F, Y, X, z]``, one frame per step."""
        graphdef, state = nnx.split(self)
        out, cache = _decode_chunk(graphdef, state, x[:, :1], None, first=True)
        outs = [out]
        for i in range(1, x.shape[1]):
            out, cache = _decode_chunk(graphdef, state, x[:, i:i + 1], cache, first=False)
            outs.append(out)
        return jnp.concatenate(outs, axis=1)

    def decode(self, z: jax.Array, *, tiled: bool = False, tile_sample_min: tuple[int, int] = (256, 256),
               tile_sample_stride: tuple[int, int] = (192, 192)) -> jax.Array:
        """Video ``[B, 3, 1 + 4 (F - 1), 8Y, 8X]`` in [-1, 1] from latents ``[B, z_dim, F, Y, X]``.

        Latents are raw VAE latents (apply :meth:`denormalize_latents` first to pipeline
        latents). Decodes one latent frame at a time with the feature cache carried over.
        ``tiled=True`` decodes overlapping spatial tiles of ``tile_sample_min`` pixels (height,
        width) every ``tile_sample_stride`` pixels and blends the overlaps linearly, as diffusers'
        ``tiled_decode``; it only takes effect when the latent is larger than one tile.
        """
        self._check_latents(z)
        x = jnp.transpose(jnp.asarray(z, self.dtype), (0, 2, 3, 4, 1))
        sf = self.scale_factor_spatial
        tile_lat = (tile_sample_min[0] // sf, tile_sample_min[1] // sf)
        if tiled and (x.shape[2] > tile_lat[0] or x.shape[3] > tile_lat[1]):
            video = self._decode_tiled(x, tile_sample_min, tile_sample_stride)
        else:
            video = self._decode_frames(x)
        return jnp.transpose(jnp.clip(video, -1.0, 1.0), (0, 4, 1, 2, 3))

    def _decode_tiled(self, x: jax.Array, tile_min: tuple[int, int], tile_stride: tuple[int, int]) -> jax.Array:
        """Tiled decode of channels-last latents ``[B, F, Y, X, z]`` → unclipped ``[B, F*, H, W, 3]``.

        Each tile is blended with the already-blended tile above and to its left over
        ``tile_min - tile_stride`` pixels (weights ramp linearly from the neighbour to the tile),
        then cropped to the stride; the mosaic is cropped to ``8Y x 8X``.
        """
        sf = self.scale_factor_spatial
        for name, v in (("tile_sample_min", tile_min), ("tile_sample_stride", tile_stride)):
            if len(v) != 2 or any(int(t) <= 0 or int(t) % sf for t in v):
                raise ValueError(f"WanVAE.decode: {name}={tuple(v)} must be two positive multiples of {sf}.")
        if any(s > m for s, m in zip(tile_stride, tile_min)):
            raise ValueError(f"WanVAE.decode: tile_sample_stride={tuple(tile_stride)} must not exceed "
                             f"tile_sample_min={tuple(tile_min)} (tiles would leave gaps).")
        (min_y, min_x), (st_y, st_x) = tile_min, tile_stride
        ly, lx = x.shape[2], x.shape[3]
        rows = []
        for i in range(0, ly, st_y // sf):
            row = []
            for j in range(0, lx, st_x // sf):
                tile = self._decode_frames(x[:, :, i:i + min_y // sf, j:j + min_x // sf])
                if rows:
                    tile = _blend(rows[-1][len(row)], tile, min_y - st_y, axis=2)
                if row:
                    tile = _blend(row[-1], tile, min_x - st_x, axis=3)
                row.append(tile)
            rows.append(row)
        mosaic = jnp.concatenate(
            [jnp.concatenate([t[:, :, :st_y, :st_x] for t in row], axis=3) for row in rows], axis=2)
        return mosaic[:, :, :ly * sf, :lx * sf]


def _blend(prev: jax.Array, tile: jax.Array, extent: int, axis: int) -> jax.Array:
    """Linear cross-fade of ``prev``'s last ``extent`` rows/cols into ``tile``'s first ones."""
    extent = min(prev.shape[axis], tile.shape[axis], extent)
    if extent <= 0:
        return tile
    w = (jnp.arange(extent, dtype=jnp.float32) / extent).astype(tile.dtype)
    w = w.reshape([-1 if a == axis else 1 for a in range(tile.ndim)])
    head = jax.lax.slice_in_dim(tile, 0, extent, axis=axis)
    tail = jax.lax.slice_in_dim(prev, prev.shape[axis] - extent, prev.shape[axis], axis=axis)
    mixed = tail * (1 - w) + head * w
    return jnp.concatenate([mixed, jax.lax.slice_in_dim(tile, extent, tile.shape[axis], axis=axis)], axis=axis)
