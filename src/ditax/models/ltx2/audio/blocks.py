"""Blocks of LTX-2's audio VAE (diffusers ``LTX2AudioResnetBlock``, ``LTX2AudioAttnBlock``,
``LTX2AudioDownsample``, ``LTX2AudioUpsample``), channels-last ``[B, T, M, C]``.

As the public models configure them: no time embedding, dropout 0, norms with eps 1e-6, SiLU,
every 3x3 convolution causal along ``axis`` (see :mod:`.audio_layers`); a width change goes
through a causal 1x1 ``nin_shortcut``. The downsampler pads one frame / bin (two on the causal
side) and convolves 3x3 with stride 2 (a plain ``Conv2d``: its key has one ``conv``); the
upsampler repeats each cell 2x2, convolves causally and drops the first frame (``"height"``) or
bin (``"width"``) so that T frames become 2T - 1. Attribute paths are diffusers' keys.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.attention import attend
from ditax.models.ltx2.audio.layers import CausalConv2d, make_norm
from ditax.models.vae.kl.layers import Conv2d

# zeros ((before, after) frames, (before, after) bins) of the stride-2 downsampler per axis
_DOWN_PAD = {"none": ((0, 1), (0, 1)), "width": ((0, 1), (2, 0)),
             "height": ((2, 0), (0, 1)), "width-compatibility": ((0, 1), (1, 0))}


class ResnetBlock(nnx.Module):
    """norm → SiLU → causal 3x3 conv → norm → SiLU → causal 3x3 conv, plus the input (through
    a causal 1x1 ``nin_shortcut`` when the width changes): ``[B, T, M, C_in]`` → ``C_out``."""

    def __init__(self, cin: int, cout: int, norm_type: str, axis: str, groups: int, *, dtype,
                 rngs):
        self.norm1 = make_norm(norm_type, cin, groups, dtype=dtype)
        self.conv1 = CausalConv2d(cin, cout, 3, axis, dtype=dtype, rngs=rngs)
        self.norm2 = make_norm(norm_type, cout, groups, dtype=dtype)
        self.conv2 = CausalConv2d(cout, cout, 3, axis, dtype=dtype, rngs=rngs)
        self.nin_shortcut = (CausalConv2d(cin, cout, 1, axis, dtype=dtype, rngs=rngs)
                             if cin != cout else None)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = self.conv1(jax.nn.silu(self.norm1(x)))
        h = self.conv2(jax.nn.silu(self.norm2(h)))
        return (x if self.nin_shortcut is None else self.nin_shortcut(x)) + h


class AttnBlock(nnx.Module):
    """One-head self-attention over all (frame, bin) cells: norm, 1x1 ``q`` / ``k`` / ``v``,
    softmax(q kᵀ / sqrt(C)) v, 1x1 ``proj_out``, plus the input. Not causal (diffusers' block
    attends to every cell); no public LTX-2 model has one."""

    def __init__(self, dim: int, norm_type: str, groups: int, *, dtype, rngs,
                 attention: str = "xla"):
        self.attention = attention
        self.norm = make_norm(norm_type, dim, groups, dtype=dtype)
        self.q = Conv2d(dim, dim, 1, dtype=dtype, rngs=rngs)
        self.k = Conv2d(dim, dim, 1, dtype=dtype, rngs=rngs)
        self.v = Conv2d(dim, dim, 1, dtype=dtype, rngs=rngs)
        self.proj_out = Conv2d(dim, dim, 1, dtype=dtype, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        b, t, m, c = x.shape
        h = self.norm(x)
        q, k, v = (f(h).reshape(b, t * m, 1, c) for f in (self.q, self.k, self.v))  # [B, L, 1, C]
        o = attend(q, k, v, backend=self.attention)
        return x + self.proj_out(o.reshape(b, t, m, c))


class Downsample(nnx.Module):
    """Pad (causal side 2, other sides 0 / 1) and convolve 3x3 with stride 2:
    ``[B, T, M, C]`` → ``[B, T', M', C]``, ``n' = (n + pad - 3) // 2 + 1`` on each axis."""

    def __init__(self, dim: int, axis: str, *, dtype, rngs):
        self.conv = Conv2d(dim, dim, 3, 2, _DOWN_PAD[axis], dtype=dtype, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.conv(x)


def downsampled(n: int, axis: str, which: int) -> int:
    """Size after one :class:`Downsample` of an axis of ``n`` cells (``which``: 0 = frames,
    1 = bins); below 1 means the input was too small."""
    before, after = _DOWN_PAD[axis][which]
    return (n + before + after - 3) // 2 + 1


class Upsample(nnx.Module):
    """Nearest 2x on both axes, a causal 3x3 conv, then the first frame (``"height"``) or bin
    (``"width"``) dropped: ``[B, T, M, C]`` → ``[B, 2T - 1, 2M, C]`` for ``"height"``."""

    def __init__(self, dim: int, axis: str, *, dtype, rngs):
        self.axis = axis
        self.conv = CausalConv2d(dim, dim, 3, axis, dtype=dtype, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.conv(jnp.repeat(jnp.repeat(x, 2, axis=1), 2, axis=2))
        if self.axis == "height":
            return x[:, 1:]
        if self.axis == "width":
            return x[:, :, 1:]
        return x


def upsampled(n: int, axis: str, which: int) -> int:
    """Size after one :class:`Upsample` of an axis of ``n`` cells (``which``: 0 = frames,
    1 = bins)."""
    return 2 * n - (1 if (axis, which) in (("height", 0), ("width", 1)) else 0)


__all__ = ["AttnBlock", "Downsample", "ResnetBlock", "Upsample", "downsampled", "upsampled"]
