"""Primitive layers of LTX-2's audio VAE, channels-last ``[B, T, M, C]`` (T mel frames = the
spectrogram's "height", M mel bins = its "width"): the causal 2-D convolution, the pixel (RMS)
norm, the norm switch, and :class:`Buffer` for the loaded tensors that are not trained.

Causality is a padding rule (diffusers ``LTX2AudioCausalConv2d``): zeros of ``(k - 1) * d`` on
one side of the causal axis (before the first frame for ``"height"``, before the first bin for
``"width"``), split evenly on the other axis; ``"none"`` splits both. The convolution itself is
the house's :class:`~ditax.models.vae.kl.layers.Conv2d`, kept under the attribute ``conv`` as
diffusers' wrapper keeps its ``nn.Conv2d`` (state-dict keys ``....conv.weight``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.models.vae.kl.layers import Conv2d, GroupNorm

NORM_EPS = 1e-6   # every norm of the audio VAE (pixel and group)


class Buffer(nnx.Variable):
    """A tensor read from the checkpoint that training leaves alone (diffusers' persistent
    buffers: latent statistics, anti-alias filters, STFT bases). Loaded and exported through the
    weight table like a parameter; ``nnx.state(model, nnx.Param)`` does not hold it."""


def causal_padding(axis: str, kernel: int, dilation: int = 1) -> tuple[tuple[int, int], ...]:
    """``((time_before, time_after), (bin_before, bin_after))`` zeros of a ``kernel`` x ``kernel``
    convolution causal along ``axis`` (diffusers' ``LTX2AudioCausalConv2d`` padding)."""
    p = (kernel - 1) * dilation
    even = (p // 2, p - p // 2)
    if axis == "height":
        return (p, 0), even
    if axis in ("width", "width-compatibility"):
        return even, (p, 0)
    return even, even


class CausalConv2d(nnx.Module):
    """A ``kernel`` x ``kernel`` convolution, stride 1, padded causally along ``axis``:
    ``[B, T, M, C_in]`` → ``[B, T, M, C_out]``."""

    def __init__(self, cin: int, cout: int, kernel: int, axis: str, *, dtype, rngs):
        self.conv = Conv2d(cin, cout, kernel, 1, causal_padding(axis, kernel), dtype=dtype,
                           rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.conv(x)


class PixelNorm(nnx.Module):
    """``x / sqrt(mean_C(x²) + eps)`` at every (frame, bin), in float32; no parameters
    (diffusers ``LTX2AudioPixelNorm``)."""

    def __init__(self, eps: float = NORM_EPS):
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        xf = x.astype(jnp.float32)
        y = xf / jnp.sqrt(jnp.mean(jnp.square(xf), axis=-1, keepdims=True) + self.eps)
        return y.astype(x.dtype)


def make_norm(norm_type: str, dim: int, groups: int, *, dtype) -> nnx.Module:
    """The block norm of ``norm_type``: :class:`PixelNorm`, or GroupNorm of ``groups`` groups
    with a gain and a bias (``norm_type="group"``)."""
    if norm_type == "pixel":
        return PixelNorm()
    return GroupNorm(groups, dim, NORM_EPS, dtype=dtype)


__all__ = ["Buffer", "CausalConv2d", "NORM_EPS", "PixelNorm", "causal_padding", "make_norm"]
