"""LTX-2's latent upsampler (diffusers ``LTX2LatentUpsamplerModel``) in Flax NNX: raw video
latents ``[B, C, F, Y, X]`` → the same latents on a finer grid, the step between the two
stages of LTX-2's two-stage sampling (:mod:`ditax.pipelines.ltx2.upsample`).

``initial_conv`` → GroupNorm → SiLU, ``num_blocks_per_stage`` residual blocks, the upsampler,
as many residual blocks again, ``final_conv``. Convolutions are 3x3(x3) with zero padding
(``dims=3``: 3-D over frames too; ``dims=2``: each frame alone). The upsampler is a
convolution to ``s x`` the channels and a pixel shuffle (:func:`~ditax.models.vae.ltx2.shuffle
.unfold`, diffusers' channel order) — in space per frame (2x, or the rational resampler:
``num``x then a binomial blur strided by ``den``), in time (2x, the first frame dropped so
``F → 2F - 1`` stays causal) or both. Module paths mirror the diffusers keys (``res_blocks.0
.conv1.weight``, ``upsampler.conv.weight`` / ``upsampler.0.weight``,
``upsampler.blur_down.kernel``). Inside, activations are channels-last.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.models.ltx2.upsampler.config import BLUR_KERNEL, GROUPS, LatentUpsamplerConfig
from ditax.models.vae.kl.layers import Conv2d, GroupNorm
from ditax.models.vae.ltx2.layers import Buffer
from ditax.models.vae.ltx2.shuffle import unfold

NORM_EPS = 1e-5      # torch nn.GroupNorm's default


class ZeroPadConv3d(nnx.Module):
    """``nn.Conv3d(kernel_size=3, padding=1)``: weight ``[kt, kh, kw, C_in, C_out]`` (torch
    ``[O, I, kt, kh, kw]`` transposed), bias ``[C_out]``; zeros around frames and pixels. Run as
    a sum over the ``kt`` time taps of per-frame 2-D convolutions (frames in the batch): the
    same sums as one 3-D convolution, which XLA:CPU runs several times slower."""

    def __init__(self, cin: int, cout: int, kernel: int = 3, *, dtype, rngs: nnx.Rngs):
        w = jax.random.normal(rngs.params(), (kernel,) * 3 + (cin, cout), jnp.float32)
        self.weight = nnx.Param((w / math.sqrt(cin * kernel ** 3)).astype(dtype))
        self.bias = nnx.Param(jnp.zeros((cout,), dtype))

    def __call__(self, x: jax.Array) -> jax.Array:
        """``[B, F, Y, X, C_in]`` → ``[B, F, Y, X, C_out]``."""
        w = self.weight[...]
        kt, p = w.shape[0], w.shape[1] // 2
        b, f = x.shape[:2]
        x = jnp.pad(x.astype(w.dtype), ((0, 0), (kt // 2, kt // 2), (0, 0), (0, 0), (0, 0)))
        out = 0
        for t in range(kt):
            frames = x[:, t:t + f].reshape(b * f, *x.shape[2:])
            out = out + jax.lax.conv_general_dilated(
                frames, w[t], window_strides=(1, 1), padding=[(p, p), (p, p)],
                dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return out.reshape(b, f, *out.shape[1:]) + self.bias[...]


def _conv(cin: int, cout: int, dims: int, *, dtype, rngs):
    """A 3x3(x3) zero-padded convolution over ``[B, F, Y, X, C]`` (dims 3) or ``[N, Y, X, C]``
    (dims 2)."""
    if dims == 3:
        return ZeroPadConv3d(cin, cout, 3, dtype=dtype, rngs=rngs)
    return Conv2d(cin, cout, 3, dtype=dtype, rngs=rngs)


class ResBlock(nnx.Module):
    """``silu(norm2(conv2(silu(norm1(conv1(x))))) + x)``."""

    def __init__(self, channels: int, dims: int, *, dtype, rngs):
        self.conv1 = _conv(channels, channels, dims, dtype=dtype, rngs=rngs)
        self.norm1 = GroupNorm(GROUPS, channels, NORM_EPS, dtype=dtype)
        self.conv2 = _conv(channels, channels, dims, dtype=dtype, rngs=rngs)
        self.norm2 = GroupNorm(GROUPS, channels, NORM_EPS, dtype=dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = jax.nn.silu(self.norm1(self.conv1(x)))
        return jax.nn.silu(self.norm2(self.conv2(h)) + x)


class BlurDown(nnx.Module):
    """The anti-aliased stride-``den`` downsample: a depthwise ``k x k`` binomial blur (the
    checkpoint's ``kernel`` buffer ``[1, 1, k, k]``, zero padding ``k // 2``); stride 1 is the
    identity, as diffusers skips it."""

    def __init__(self, stride: int, *, dtype):
        self.stride = stride
        self.kernel = Buffer(jnp.zeros((1, 1, BLUR_KERNEL, BLUR_KERNEL), dtype))

    def __call__(self, x: jax.Array) -> jax.Array:
        """``[N, Y, X, C]`` → ``[N, ceil(Y / s), ceil(X / s), C]``."""
        if self.stride == 1:
            return x
        k = self.kernel[...][0, 0]
        c = x.shape[-1]
        w = jnp.broadcast_to(k[:, :, None, None], k.shape + (1, c)).astype(x.dtype)
        p = k.shape[0] // 2
        return jax.lax.conv_general_dilated(
            x, w, window_strides=(self.stride, self.stride), padding=[(p, p), (p, p)],
            dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=c)


class RationalResampler(nnx.Module):
    """Spatial ``num / den``: a convolution to ``num²`` times the channels, the ``num x num``
    shuffle, the stride-``den`` blur; per frame ``[N, Y, X, C]``."""

    def __init__(self, channels: int, num: int, den: int, *, dtype, rngs):
        self.num = num
        self.conv = Conv2d(channels, num * num * channels, 3, dtype=dtype, rngs=rngs)
        self.blur_down = BlurDown(den, dtype=dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        y = unfold(self.conv(x)[:, None], (1, self.num, self.num))[:, 0]
        return self.blur_down(y)


class LatentUpsampler(nnx.Module):
    """diffusers' ``LTX2LatentUpsamplerModel``; call it on ``[B, C, F, Y, X]`` raw latents."""

    def __init__(self, config: LatentUpsamplerConfig, *, dtype=jnp.float32, rngs: nnx.Rngs):
        config.validate()
        self.config = config
        self.dtype = jnp.dtype(dtype)
        c, m, d, n = (config.in_channels, config.mid_channels, config.dims,
                      config.num_blocks_per_stage)
        self.initial_conv = _conv(c, m, d, dtype=dtype, rngs=rngs)
        self.initial_norm = GroupNorm(GROUPS, m, NORM_EPS, dtype=dtype)
        self.res_blocks = nnx.List([ResBlock(m, d, dtype=dtype, rngs=rngs) for _ in range(n)])
        st, num, den = config.factors
        if config.rational:
            self.upsampler = RationalResampler(m, num, den, dtype=dtype, rngs=rngs)
        elif config.temporal_upsample:   # diffusers' Sequential(Conv3d, shuffle): key "0"
            self.upsampler = nnx.List([ZeroPadConv3d(m, st * num * num * m, 3, dtype=dtype,
                                                     rngs=rngs)])
        else:
            self.upsampler = nnx.List([Conv2d(m, num * num * m, 3, dtype=dtype, rngs=rngs)])
        self.post_upsample_res_blocks = nnx.List(
            [ResBlock(m, d, dtype=dtype, rngs=rngs) for _ in range(n)])
        self.final_conv = _conv(m, c, d, dtype=dtype, rngs=rngs)

    def _upsample(self, x: jax.Array) -> jax.Array:
        """``[B, F, Y, X, M]`` → the finer grid (frames folded into the batch for a spatial
        one)."""
        st, num, den = self.config.factors
        if self.config.temporal_upsample:
            y = unfold(self.upsampler[0](x), (st, num, num))
            return y[:, 1:]             # the first frame has no past to interpolate from
        b, f = x.shape[:2]
        flat = x.reshape(b * f, *x.shape[2:])
        y = self.upsampler(flat) if self.config.rational else \
            unfold(self.upsampler[0](flat)[:, None], (1, num, num))[:, 0]
        return y.reshape(b, f, *y.shape[1:])

    def __call__(self, latents: jax.Array) -> jax.Array:
        """Raw latents ``[B, C, F, Y, X]`` → ``[B, C, F', Y', X']``
        (:meth:`LatentUpsamplerConfig.out_grid`), in the parameters' dtype."""
        x = jnp.asarray(latents).astype(self.dtype).transpose(0, 2, 3, 4, 1)
        b, f = x.shape[:2]
        two_d = self.config.dims == 2
        if two_d:                            # every layer sees frames one by one
            x = x.reshape(b * f, *x.shape[2:])
        x = jax.nn.silu(self.initial_norm(self.initial_conv(x)))
        for block in self.res_blocks:
            x = block(x)
        if two_d:
            x = self._upsample(x[:, None])[:, 0]
        else:
            x = self._upsample(x)
        for block in self.post_upsample_res_blocks:
            x = block(x)
        x = self.final_conv(x)
        if two_d:
            x = x.reshape(b, f, *x.shape[1:])
        return x.transpose(0, 4, 1, 2, 3)


__all__ = ["BlurDown", "LatentUpsampler", "RationalResampler", "ResBlock", "ZeroPadConv3d"]
