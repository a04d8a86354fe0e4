"""Primitive layers of the Wan VAE, channels-last ``[B, F, Y, X, C]``.

Causal 3-D convolution (with the feature cache that lets a video be processed in chunks),
per-frame 2-D convolution, pointwise projection and the VAE's RMS norm. Parameter names match
the diffusers state-dict keys (see ``convert.py``).

The decoder's TPU fast path (:func:`fast_path`, made active by :mod:`.chunks` for one-device
TPU decodes) changes how these layers compute, not what: activations carry their channels
padded with zeros to a multiple of 128 where they are not one (Wan 2.1's 96- and 192-channel
levels; :func:`padded`), weights are zero-padded to match at trace time (the padded channels
stay exactly zero through norms, SiLU and convolutions), and :meth:`CausalConv3d.fused` runs the
3x3x3 convolutions as :mod:`.conv_tpu` kernels with the norm / residual that follows them fused.
With ``FastPath(pack=True)`` (opt-in) the kernels put their taps' real input channels side by
side in one contraction (:mod:`.conv_tpu_pack`): fewer MXU passes where channels are padded,
and no per-tap accumulator traffic; at 192 output channels the column taps' outputs side by
side in the product's lanes too.
Inside a row split (:mod:`ditax.nn.halo`) the fast path is off.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.models.vae.wan import conv_tpu, conv_tpu_pack
from ditax.nn import halo
from ditax.parallel.platform import platform_of

CACHE_FRAMES = 2  # frames of left context kept per causal conv (diffusers CACHE_T)

Cache = Any  # nested dict/list of arrays [B, frames, Y, X, C] or None


@dataclass(frozen=True)
class FastPath:
    """The decoder's TPU fast path; ``interpret``: run its kernels in Pallas' interpret mode
    (CPU tests of the TPU program); ``pack``: pack the kernels' taps (:meth:`pack_for`).

    For diagnosis the packing can be restricted (the default packs every kernel): ``only``,
    the real input channel counts whose kernels pack (None: all; e.g. ``(96,)``: the 96-wide
    level's convolutions and ``conv_out``), ``columns=False``: no kernel puts its column taps
    side by side (:meth:`cols_for`). Frozen and hashable: a decode program's static argument
    (``path``, :mod:`.chunks`), so differently restricted paths trace different programs."""

    interpret: bool = False
    pack: bool = False
    only: tuple[int, ...] | None = None
    columns: bool = True

    def __post_init__(self):
        if self.only is not None:   # a list or set given: a sorted tuple (hashable, one key)
            object.__setattr__(self, "only", tuple(sorted(int(c) for c in self.only)))

    def packs(self, c: int) -> bool:
        """Whether kernels of ``c`` real channels may pack: packing on, ``c`` in ``only``."""
        return self.pack and (self.only is None or c in self.only)

    def pack_for(self, cin: int, narrow: bool = False) -> int | None:
        """The kernel's ``pack`` for ``cin`` real input channels: ``cin`` when packing is on
        (and ``cin`` in ``only``; 96: 7 MXU passes of 9 a column tap; 192: 14 of 18, 5 of 6 in
        2-D; 384: 27 either way, in one product), else None. Never for a ``narrow`` kernel
        (``conv_out``, :func:`.conv_tpu.narrow_channels`): on a TPU v5e (JAX 0.10.2, libtpu
        0.0.42.1) its packed form is right alone but 0.55 off inside the decode's compiled
        program, on inputs that give the right values alone (``benchmarks/vae_capture.py``,
        ``docs/tpu_v5e.md`` session 65); unpacked it is right in both."""
        return cin if self.packs(cin) and not narrow else None

    def cols_for(self, cout: int) -> int | None:
        """The kernel's ``cols`` for ``cout`` real output channels (not ``phases``; only
        where the kernel packs): ``cout`` when packing is on, ``columns``, ``cout`` in
        ``only`` and the column taps side by side take fewer output passes (192: 5 of 6),
        else None."""
        wide = 3 * cout > conv_tpu.LANES and conv_tpu_pack.saves_columns(cout)
        return cout if self.columns and self.packs(cout) and wide else None


_FAST: contextvars.ContextVar[FastPath | None] = contextvars.ContextVar("wan_vae_fast",
                                                                        default=None)


@contextlib.contextmanager
def fast_path(path: FastPath | None):
    """Trace the layers inside with ``path`` (None: the plain layers)."""
    token = _FAST.set(path)
    try:
        yield path
    finally:
        _FAST.reset(token)


def fast() -> FastPath | None:
    """The active fast path; None without one or inside a row split."""
    path = _FAST.get()
    return None if path is None or halo.active() is not None else path


def padded(c: int) -> int:
    """Channels an activation of ``c`` channels carries: on the fast path a width of at least
    64 that is not a multiple of 128 is rounded up to one (video and latent channels stay)."""
    if fast() is None or c < 64 or c % conv_tpu.LANES == 0:
        return c
    return -(-c // conv_tpu.LANES) * conv_tpu.LANES


def pad_axis(a: jax.Array, axis: int, size: int) -> jax.Array:
    """``a`` zero-padded at the end of ``axis`` to ``size``."""
    extra = size - a.shape[axis]
    if not extra:
        return a
    widths = [(0, 0)] * a.ndim
    widths[axis] = (0, extra)
    return jnp.pad(a, widths)


def _tail(cache: jax.Array, x: jax.Array, n: int) -> jax.Array:
    """The last ``n`` frames of ``concatenate([cache, x])`` without concatenating all of x."""
    if x.shape[1] >= n:
        return x[:, -n:]
    return jnp.concatenate([cache[:, x.shape[1] - n:], x], axis=1)


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

    def weights(self, cin: int, cout: int | None = None) -> tuple[jax.Array, jax.Array]:
        """(weight, bias) for an input of ``cin`` channels: zero-padded to it and to
        ``cout`` (default :func:`padded` of the layer's) output channels."""
        w, b = self.weight[...], self.bias[...]
        cout = padded(w.shape[-1]) if cout is None else cout
        return pad_axis(pad_axis(w, 3, cin), 4, cout), pad_axis(b, 0, cout)

    def conv(self, x: jax.Array) -> jax.Array:
        """Plain convolution with no temporal padding. x ``[B, F, Y, X, C]``.

        On CPU it runs as ``kt`` per-frame 2-D convolutions summed over the kernel's time taps
        (:func:`conv3d_by_frames`): XLA's CPU 3-D convolution is 2.5-4x slower than that,
        forward and backward (measured at 8-64 channels). Elsewhere one 3-D convolution."""
        py, px = self.pad_yx
        w, b = self.weights(x.shape[-1])
        if fast() is not None and w.shape[:3] == (1, 1, 1) and self.stride == (1, 1, 1):
            return jnp.einsum("bfyxc,cd->bfyxd", x, w[0, 0, 0]) + b   # a product, not a conv
        x, pad_y = halo.rows(x, (py, py))  # neighbours' rows when the frame is row-split
        if platform_of().name == "cpu":
            y = conv3d_by_frames(x, w, self.stride, (pad_y, (px, px)))
        else:
            y = jax.lax.conv_general_dilated(
                x, w, window_strides=self.stride,
                padding=[(0, 0), pad_y, (px, px)], dimension_numbers=("NDHWC", "DHWIO", "NDHWC"))
        return y + b

    def __call__(self, x: jax.Array, cache: jax.Array | None = None):
        """x ``[B, F, Y, X, C]``, cache ``[B, context, Y, X, C]`` or None → (y, new cache)."""
        if not self.context:
            return self.conv(x), None
        if cache is None:
            cache = jnp.zeros((x.shape[0], self.context, *x.shape[2:]), x.dtype)
        xc = jnp.concatenate([cache.astype(x.dtype), x], axis=1)
        return self.conv(xc), xc[:, -self.context:]

    def fused(self, x: jax.Array, cache: jax.Array | None, *, act=None,
              residual: jax.Array | None = None):
        """:meth:`__call__` followed by ``+ residual`` and then ``silu(act(.))`` (``act``: an
        :class:`RMSNorm`), each when given → (result, new cache). On the fast path a 3x3x3
        convolution with one pixel of padding runs as one :mod:`.conv_tpu` kernel with both
        fused."""
        path = fast()
        if path is not None and self._kernel_fits(x, act is None and residual is None):
            c = -(-x.shape[-1] // conv_tpu.LANES) * conv_tpu.LANES   # conv_in's latent: 16 → 128
            x = pad_axis(x, 4, c)
            w, b = self.weights(c)
            cache = (jnp.zeros((x.shape[0], self.context, *x.shape[2:]), x.dtype) if cache is None
                     else pad_axis(cache.astype(x.dtype), 4, c))
            norm = None if act is None else (act.gamma_for(w.shape[-1]), act.scale)
            narrow = conv_tpu.narrow_channels(w.shape[-1], norm, residual) > 0
            pack = path.pack_for(self.weight.shape[3], narrow)   # cols need pack
            cols = None if pack is None else path.cols_for(self.weight.shape[4])
            y = conv_tpu.causal_conv3x3(x, cache, w, b, act=norm, residual=residual,
                                        pack=pack, cols=cols,
                                        interpret=path.interpret)
            return y, _tail(cache, x, self.context)
        y, cache = self(x, cache)
        if residual is not None:
            y = y + residual
        if act is not None:
            y = jax.nn.silu(act(y))
        return y, cache

    def _kernel_fits(self, x: jax.Array, plain: bool) -> bool:
        """A 3x3x3 conv the kernel takes; fused epilogues want whole lanes of outputs."""
        cout = padded(self.weight.shape[-1])
        return (tuple(self.weight.shape[:3]) == (3, 3, 3) and self.stride == (1, 1, 1)
                and self.context == CACHE_FRAMES and self.pad_yx == (1, 1)
                and (plain or cout % conv_tpu.LANES == 0)
                and conv_tpu.supported((*x.shape[:4], conv_tpu.LANES), cout))


def conv3d_by_frames(x: jax.Array, w: jax.Array, stride, pad_yx) -> jax.Array:
    """Valid-in-time 3-D convolution as a sum over the kernel's ``kt`` time taps of 2-D
    convolutions of strided frame slices (frames folded into the batch). x ``[B, F, Y, X, C]``,
    w ``[kt, kh, kw, C, C_out]``, ``pad_yx`` ``((top, bottom), (left, right))``; the same sums
    as one 3-D convolution in another order."""
    kt = w.shape[0]
    st, sy, sx = stride
    b, f = x.shape[:2]
    fo = (f - kt) // st + 1
    out = None
    for t in range(kt):
        xt = x[:, t:t + st * (fo - 1) + 1:st]
        yt = jax.lax.conv_general_dilated(
            xt.reshape(b * fo, *x.shape[2:]), w[t], window_strides=(sy, sx),
            padding=[tuple(pad_yx[0]), tuple(pad_yx[1])],
            dimension_numbers=("NHWC", "HWIO", "NHWC"))
        out = yt if out is None else out + yt
    return out.reshape(b, fo, *out.shape[1:])


class Conv2d(nnx.Module):
    """Per-frame 2-D convolution. weight ``[kh, kw, C_in, C_out]``, bias ``[C_out]``."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, padding, *, dtype, rngs):
        self.stride = (stride, stride)
        self.padding = padding  # ((top, bottom), (left, right))
        self.weight = _init(rngs, (kernel, kernel, cin, cout), cin * kernel * kernel, dtype)
        self.bias = nnx.Param(jnp.zeros((cout,), dtype))

    def weights(self, cin: int) -> tuple[jax.Array, jax.Array]:
        """(weight, bias) zero-padded to ``cin`` input and :func:`padded` output channels."""
        w, b = self.weight[...], self.bias[...]
        cout = padded(w.shape[-1])
        return pad_axis(pad_axis(w, 2, cin), 3, cout), pad_axis(b, 0, cout)

    def __call__(self, x: jax.Array) -> jax.Array:
        """x ``[B, F, Y, X, C]`` → ``[B, F, Y', X', C_out]``."""
        b, f = x.shape[:2]
        w, bias = self.weights(x.shape[-1])
        x, pad_y = halo.rows(x, self.padding[0])  # neighbours' rows when the frame is row-split
        y = jax.lax.conv_general_dilated(
            x.reshape(b * f, *x.shape[2:]), w, window_strides=self.stride,
            padding=(pad_y, tuple(self.padding[1])), dimension_numbers=("NHWC", "HWIO", "NHWC"))
        y = y + bias
        return y.reshape(b, f, *y.shape[1:])

    def upsampled(self, x: jax.Array) -> jax.Array:
        """This 3x3, stride-1, one-pixel-padded conv of ``x`` upsampled 2x (nearest) in Y and X,
        computed on ``x`` itself: each output pixel's parity (a, b) sees a 2x2 window of input
        pixels with the 3x3 kernel's taps summed per input pixel (weights combined in float32),
        so one 3x3 conv with ``4 C_out`` outputs (zero taps included) gives all four phases;
        no 4x upsampled input is made. ``[B, F, Y, X, C]`` → ``[B, F, 2Y, 2X, C_out]``."""
        w, bias = self.weights(x.shape[-1])
        kh, kw, cin, cout = w.shape
        # taps[a, r, d]: kernel row d feeds output parity a from input row offset r - 1
        taps = jnp.asarray([[[1, 0, 0], [0, 1, 1], [0, 0, 0]],
                            [[0, 0, 0], [1, 1, 0], [0, 0, 1]]], jnp.float32)
        w4 = jnp.einsum("ard,bse,deio->rsiabo", taps, taps, w.astype(jnp.float32))
        w4 = w4.reshape(3, 3, cin, 4 * cout).astype(w.dtype)
        path = fast()
        if path is not None and conv_tpu.supported(x.shape, 4 * cout) and cout % conv_tpu.LANES == 0:
            return conv_tpu.causal_conv3x3(x, None, w4[None], jnp.tile(bias, 4), phases=True,
                                           pack=path.pack_for(self.weight.shape[2]),
                                           interpret=path.interpret)
        b, f, yy, xx, _ = x.shape
        y = jax.lax.conv_general_dilated(
            x.reshape(b * f, yy, xx, cin), w4, window_strides=(1, 1), padding=((1, 1), (1, 1)),
            dimension_numbers=("NHWC", "HWIO", "NHWC"))
        y = y.reshape(b, f, yy, xx, 2, 2, cout).transpose(0, 1, 2, 4, 3, 5, 6)
        return y.reshape(b, f, 2 * yy, 2 * xx, cout) + bias


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

    def gamma_for(self, c: int) -> jax.Array:
        """gamma zero-padded to ``c`` channels (zeros keep padded channels zero)."""
        return pad_axis(self.gamma[...], 0, c)

    def __call__(self, x: jax.Array) -> jax.Array:
        xf = x.astype(jnp.float32)
        norm = jnp.sqrt(jnp.sum(xf * xf, axis=-1, keepdims=True))
        y = (xf / jnp.maximum(norm, 1e-12)).astype(x.dtype)
        return y * self.scale * self.gamma_for(x.shape[-1])

