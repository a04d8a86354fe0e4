"""Primitive layers of LTX-2's video VAE, channels-last ``[B, F, Y, X, C]``.

- :class:`CausalConv3d` (diffusers ``LTX2VideoCausalConv3d``): a stride-1 3-D convolution whose
  time padding *repeats edge frames* (causal: the first frame ``k - 1`` times before the video;
  non-causal: the first and the last ``(k - 1) / 2`` times each side) and whose spatial padding
  is zeros or reflection (the config's ``*_spatial_padding_mode``; a side of one pixel, which
  torch refuses to reflect, reflects as its edge); the torch module keeps its
  ``nn.Conv3d`` as ``conv``, so does this one (state-dict keys ``....conv.weight``);
- :class:`Pointwise`: the resnet shortcut's 1x1x1 ``nn.Conv3d`` as a matrix product;
- :func:`rms_norm` (diffusers ``PerChannelRMSNorm``, no parameters) and :class:`Buffer`.

On CPU the 3-D convolution runs as per-frame 2-D ones (the Wan VAE's
:func:`~ditax.models.vae.wan.layers.conv3d_by_frames`, 2.5-4x faster on XLA:CPU); elsewhere as
one 3-D convolution.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.models.vae.wan.layers import conv3d_by_frames
from ditax.nn import halo
from ditax.parallel.platform import platform_of

RMS_EPS = 1e-8   # diffusers' PerChannelRMSNorm default, used everywhere in this VAE


class Buffer(nnx.Variable):
    """A checkpoint tensor that training leaves alone (diffusers' persistent buffers: the
    latent statistics). Loaded and exported through the weight table like a parameter;
    ``nnx.state(model, nnx.Param)`` does not hold it."""


def _init(rngs: nnx.Rngs, shape, fan_in: int, dtype) -> nnx.Param:
    w = jax.random.normal(rngs.params(), shape, jnp.float32) / math.sqrt(fan_in)
    return nnx.Param(w.astype(dtype))


def rms_norm(x: jax.Array, eps: float = RMS_EPS) -> jax.Array:
    """``x / sqrt(mean_C(x²) + eps)`` over the channels, in float32, returned in ``x.dtype``."""
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return y.astype(x.dtype)


class Conv3d(nnx.Module):
    """``nn.Conv3d`` with stride 1 and no padding of its own: weight ``[kt, kh, kw, C_in,
    C_out]`` (torch ``[O, I, kt, kh, kw]`` transposed), bias ``[C_out]``."""

    def __init__(self, cin: int, cout: int, kernel: int, *, dtype, rngs: nnx.Rngs):
        self.kernel = kernel
        self.weight = _init(rngs, (kernel,) * 3 + (cin, cout), cin * kernel ** 3, dtype)
        self.bias = nnx.Param(jnp.zeros((cout,), dtype))

    def __call__(self, x: jax.Array, pad_yx: tuple[int, int] = (0, 0)) -> jax.Array:
        """Valid in time, ``pad_yx`` zeros each side in space: ``[B, F, Y, X, C_in]`` →
        ``[B, F - kt + 1, Y', X', C_out]``."""
        w = self.weight[...]
        x = x.astype(w.dtype)
        if platform_of().name == "cpu":
            py, px = pad_yx
            y = conv3d_by_frames(x, w, (1, 1, 1), ((py, py), (px, px)))
        else:
            py, px = pad_yx
            y = jax.lax.conv_general_dilated(
                x, w, window_strides=(1, 1, 1), padding=[(0, 0), (py, py), (px, px)],
                dimension_numbers=("NDHWC", "DHWIO", "NDHWC"))
        return y + self.bias[...]


class CausalConv3d(nnx.Module):
    """A ``k x k x k`` convolution padded to keep ``[B, F, Y, X, C]``'s frames and pixels:
    edge frames repeated in time (``causal`` chosen per call, as diffusers), ``padding_mode``
    (``zeros`` / ``reflect``) in space."""

    def __init__(self, cin: int, cout: int, kernel: int = 3, *, padding_mode: str, dtype, rngs):
        self.padding_mode = padding_mode
        self.conv = Conv3d(cin, cout, kernel, dtype=dtype, rngs=rngs)

    def __call__(self, x: jax.Array, causal: bool) -> jax.Array:
        """``[B, F, Y, X, C_in]`` → ``[B, F, Y, X, C_out]``."""
        k = self.conv.kernel
        before, after = (k - 1, 0) if causal else ((k - 1) // 2, (k - 1) // 2)
        if before or after:
            x = jnp.pad(x, ((0, 0), (before, after), (0, 0), (0, 0), (0, 0)), mode="edge")
        p = k // 2
        # rows split over devices (ditax.nn.halo; a no-op on one device): the neighbours' rows
        # attached, the frame's edges padded as this layer pads them
        x, (py, _) = halo.rows(x, (p, p), self.padding_mode)
        if p and self.padding_mode == "reflect":
            x = jnp.pad(x, ((0, 0), (0, 0), (py, py), (p, p), (0, 0)), mode="reflect")
            return self.conv(x)
        return self.conv(x, (py, p))


class Pointwise(nnx.Module):
    """A 1x1x1 ``nn.Conv3d`` as ``x @ weight + bias``: weight ``[C_in, C_out]``."""

    def __init__(self, cin: int, cout: int, *, dtype, rngs):
        self.weight = _init(rngs, (cin, cout), cin, dtype)
        self.bias = nnx.Param(jnp.zeros((cout,), dtype))

    def __call__(self, x: jax.Array) -> jax.Array:
        w = self.weight[...]
        return x.astype(w.dtype) @ w + self.bias[...]


__all__ = ["Buffer", "CausalConv3d", "Conv3d", "Pointwise", "RMS_EPS", "rms_norm"]
