"""1-D layers of LTX-2's vocoders, channels-last ``[B, S, C]`` (S samples or mel frames):
convolution, transposed convolution, the Snake / SnakeBeta activations, and the anti-aliased
activation (2x up-sample → activation → 2x down-sample with Kaiser-windowed sinc low-pass
filters, BigVGAN's scheme; diffusers ``UpSample1d`` / ``DownSample1d`` / ``AntiAliasAct1d``).

Parameter names are torch's (``weight``, ``bias``, ``alpha``, ``beta``; the anti-alias filters
are :class:`~.audio_layers.Buffer` s named ``filter``, read from the checkpoint as diffusers reads
them, computed by :func:`kaiser_sinc_filter` for a fresh model). Layouts (torch → ours):
``Conv1d`` ``[O, I, k]`` → ``[k, I, O]``; ``ConvTranspose1d`` ``[I, O, k]`` → ``[k, I, O]``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ditax.models.ltx2.audio.layers import Buffer

SNAKE_EPS = 1e-9          # diffusers' SnakeBeta eps
_DIMS = ("NWC", "WIO", "NWC")


def _init(rngs, shape, fan_in, dtype):
    return (jax.random.normal(rngs.params(), shape, jnp.float32) / math.sqrt(fan_in)).astype(dtype)


class Conv1d(nnx.Module):
    """``nn.Conv1d`` with zero padding ``(left, right)`` (default: torch's ``"same"`` for odd
    receptive fields, ``d (k - 1)`` split with the extra zero on the right):
    ``[B, S, C_in]`` → ``[B, S', C_out]``."""

    def __init__(self, cin: int, cout: int, kernel: int, *, dilation: int = 1, padding=None,
                 bias: bool = True, dtype, rngs: nnx.Rngs):
        total = dilation * (kernel - 1)
        self.padding = tuple(padding) if padding is not None else (total // 2, total - total // 2)
        self.dilation = dilation
        self.weight = nnx.Param(_init(rngs, (kernel, cin, cout), cin * kernel, dtype))
        self.bias = nnx.Param(jnp.zeros((cout,), dtype)) if bias else None

    def __call__(self, x: jax.Array) -> jax.Array:
        w = self.weight[...]
        y = jax.lax.conv_general_dilated(x.astype(w.dtype), w, (1,), [self.padding],
                                         rhs_dilation=(self.dilation,), dimension_numbers=_DIMS)
        return y if self.bias is None else y + self.bias[...]


def conv_transpose(x: jax.Array, w: jax.Array, stride: int, padding: int, groups: int = 1):
    """torch's ``conv_transpose1d``: ``x`` ``[B, S, I]``, ``w`` ``[k, I / groups, O]`` with taps
    in torch's order → ``[B, (S - 1) stride - 2 padding + k, O]`` (a stride-1 correlation of the
    zero-stuffed input with the flipped kernel; ``groups=C`` with ``w`` ``[k, 1, C]``:
    depthwise)."""
    k = w.shape[0]
    return jax.lax.conv_general_dilated(
        x, jnp.flip(w, 0), (1,), [(k - 1 - padding, k - 1 - padding)], lhs_dilation=(stride,),
        dimension_numbers=_DIMS, feature_group_count=groups)


class ConvTranspose1d(nnx.Module):
    """``nn.ConvTranspose1d(cin, cout, kernel, stride, padding)``: ``[B, S, C_in]`` →
    ``[B, (S - 1) stride - 2 padding + kernel, C_out]``."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, padding: int, *, dtype,
                 rngs: nnx.Rngs):
        self.stride, self.padding = stride, padding
        self.weight = nnx.Param(_init(rngs, (kernel, cin, cout), cin * kernel // stride, dtype))
        self.bias = nnx.Param(jnp.zeros((cout,), dtype))

    def __call__(self, x: jax.Array) -> jax.Array:
        w = self.weight[...]
        return conv_transpose(x.astype(w.dtype), w, self.stride, self.padding) + self.bias[...]


class LeakyReLU(nnx.Module):
    """``max(x, slope x)``; no parameters."""

    def __init__(self, slope: float):
        self.slope = slope

    def __call__(self, x: jax.Array) -> jax.Array:
        return jax.nn.leaky_relu(x, self.slope)


class SnakeBeta(nnx.Module):
    """``x + sin²(x e^alpha) / (e^beta + 1e-9)`` per channel (``use_beta=False``, Snake: the
    amplitude is ``e^alpha`` too). ``alpha`` / ``beta`` ``[C]`` are log-scale, zero at init."""

    def __init__(self, dim: int, use_beta: bool, *, dtype):
        self.alpha = nnx.Param(jnp.zeros((dim,), dtype))
        self.beta = nnx.Param(jnp.zeros((dim,), dtype)) if use_beta else None

    def __call__(self, x: jax.Array) -> jax.Array:
        alpha = jnp.exp(self.alpha[...])
        amplitude = alpha if self.beta is None else jnp.exp(self.beta[...])
        return x + (1.0 / (amplitude + SNAKE_EPS)) * jnp.square(jnp.sin(x * alpha))


def kaiser_sinc_filter(cutoff: float, half_width: float, kernel: int) -> np.ndarray:
    """A Kaiser-windowed sinc low-pass of ``kernel`` taps at ``cutoff`` (of the sample rate),
    normalised to sum 1 (diffusers' ``kaiser_sinc_filter1d``; the window's beta from the
    transition ``half_width`` by Kaiser's formula)."""
    half = kernel // 2
    amplitude = 2.285 * (half - 1) * math.pi * 4 * half_width + 7.95
    if amplitude > 50.0:
        beta = 0.1102 * (amplitude - 8.7)
    elif amplitude >= 21.0:
        beta = 0.5842 * (amplitude - 21) ** 0.4 + 0.07886 * (amplitude - 21.0)
    else:
        beta = 0.0
    t = np.arange(-half, half) + 0.5 if kernel % 2 == 0 else np.arange(kernel) - half
    if cutoff == 0.0:
        return np.zeros(kernel)
    f = 2 * cutoff * np.kaiser(kernel, beta) * np.sinc(2 * cutoff * t)
    return f / f.sum()


def hann_sinc_filter(ratio: int, width: int = 6, rolloff: float = 0.99) -> np.ndarray:
    """The Hann-windowed sinc of the BWE vocoder's resampler (``2 ceil(width / rolloff) ratio +
    1`` taps; diffusers ``UpSample1d(window_type="hann")``, not stored in checkpoints)."""
    half = math.ceil(width / rolloff)
    t = (np.arange(2 * half * ratio + 1) / ratio - half) * rolloff
    window = np.cos(np.clip(t, -width, width) * math.pi / width / 2) ** 2
    return np.sinc(t) * window * rolloff / ratio


def upsample(x: jax.Array, taps: jax.Array, ratio: int, pad: int, crop: tuple[int, int]):
    """``ratio`` x up-sampling of ``[B, S, C]`` with one low-pass shared by all channels:
    replicate-pad ``pad``, zero-stuff and filter (a depthwise transposed conv), times ``ratio``,
    then cut ``crop`` samples off each end: ``[B, ratio S, C]``."""
    c = x.shape[-1]
    x = jnp.pad(x, ((0, 0), (pad, pad), (0, 0)), mode="edge")
    w = jnp.broadcast_to(taps.astype(x.dtype)[:, None, None], (taps.shape[0], 1, c))
    y = ratio * conv_transpose(x, w, ratio, 0, groups=c)
    return y[:, crop[0]:y.shape[1] - crop[1]]


class UpSample1d(nnx.Module):
    """Kaiser low-pass ``ratio`` x up-sampler (diffusers ``UpSample1d``, window ``kaiser``):
    ``[B, S, C]`` → ``[B, ratio S, C]``."""

    def __init__(self, ratio: int, kernel: int, *, dtype):
        self.ratio, self.kernel = ratio, kernel
        taps = kaiser_sinc_filter(0.5 / ratio, 0.6 / ratio, kernel)
        self.filter = Buffer(jnp.asarray(taps, dtype).reshape(1, 1, kernel))

    def __call__(self, x: jax.Array) -> jax.Array:
        r, k = self.ratio, self.kernel
        pad = k // r - 1
        crop = (pad * r + (k - r) // 2, pad * r + (k - r + 1) // 2)
        return upsample(x, self.filter[...].reshape(k), r, pad, crop)


class DownSample1d(nnx.Module):
    """Kaiser low-pass ``ratio`` x down-sampler (diffusers ``DownSample1d``): replicate-pad
    ``k / 2 - 1`` (+1 for odd k) before and ``k / 2`` after, filter, keep every ``ratio``-th:
    ``[B, S, C]`` → ``[B, ceil(S / ratio), C]`` for even k."""

    def __init__(self, ratio: int, kernel: int, *, dtype):
        self.ratio, self.kernel = ratio, kernel
        taps = kaiser_sinc_filter(0.5 / ratio, 0.6 / ratio, kernel)
        self.filter = Buffer(jnp.asarray(taps, dtype).reshape(1, 1, kernel))

    def __call__(self, x: jax.Array) -> jax.Array:
        r, k, c = self.ratio, self.kernel, x.shape[-1]
        x = jnp.pad(x, ((0, 0), (k // 2 + k % 2 - 1, k // 2), (0, 0)), mode="edge")
        w = jnp.broadcast_to(self.filter[...].reshape(k, 1, 1).astype(x.dtype), (k, 1, c))
        return jax.lax.conv_general_dilated(x, w, (r,), [(0, 0)], dimension_numbers=_DIMS,
                                            feature_group_count=c)


class AntiAliasAct(nnx.Module):
    """``downsample(act(upsample(x)))``: an activation run at ``ratio`` x the sample rate so its
    harmonics above the original Nyquist are filtered out (diffusers ``AntiAliasAct1d``)."""

    def __init__(self, act: nnx.Module, ratio: int, kernel: int, *, dtype):
        self.upsample = UpSample1d(ratio, kernel, dtype=dtype)
        self.act = act
        self.downsample = DownSample1d(ratio, kernel, dtype=dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.downsample(self.act(self.upsample(x)))


__all__ = ["AntiAliasAct", "Conv1d", "ConvTranspose1d", "DownSample1d", "LeakyReLU", "SnakeBeta",
           "UpSample1d", "conv_transpose", "hann_sinc_filter", "kaiser_sinc_filter", "upsample"]
