"""Blocks of the image VAE (diffusers ``ResnetBlock2D``, the mid block's ``Attention``,
``Downsample2D`` / ``Upsample2D``, ``DownEncoderBlock2D`` / ``UpDecoderBlock2D`` /
``UNetMidBlock2D``), channels-last ``[B, Y, X, C]``.

The configuration of these blocks in an ``AutoencoderKL``: GroupNorm eps 1e-6, SiLU, no time
embedding, output scale 1, dropout 0; the downsampler pads right / bottom by one and convolves
3x3 with stride 2; the upsampler repeats each pixel 2x2 (nearest) and convolves 3x3. Attribute
paths are the diffusers state-dict keys. Each block is a pure function of its parameters, so a
VAE trainer can reuse them (``nnx.split`` / ``nnx.merge``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.attention import attend
from ditax.models.vae.kl.layers import Conv2d, GroupNorm
from ditax.nn import Linear, halo

EPS = 1e-6  # every norm of diffusers' VAE encoder / decoder


class ResnetBlock2D(nnx.Module):
    """GroupNorm → SiLU → 3x3 conv → GroupNorm → SiLU → 3x3 conv, plus the input (through a
    1x1 ``conv_shortcut`` when the width changes)."""

    def __init__(self, cin: int, cout: int, groups: int, *, dtype, rngs):
        self.norm1 = GroupNorm(groups, cin, EPS, dtype=dtype)
        self.conv1 = Conv2d(cin, cout, 3, dtype=dtype, rngs=rngs)
        self.norm2 = GroupNorm(groups, cout, EPS, dtype=dtype)
        self.conv2 = Conv2d(cout, cout, 3, dtype=dtype, rngs=rngs)
        self.conv_shortcut = Conv2d(cin, cout, 1, dtype=dtype, rngs=rngs) if cin != cout else None

    def __call__(self, x: jax.Array) -> jax.Array:
        """``[B, Y, X, C_in]`` → ``[B, Y, X, C_out]``."""
        h = self.conv1(jax.nn.silu(self.norm1(x)))
        h = self.conv2(jax.nn.silu(self.norm2(h)))
        return (x if self.conv_shortcut is None else self.conv_shortcut(x)) + h


class Attention(nnx.Module):
    """One-head self-attention over all pixels (diffusers' VAE ``Attention``: GroupNorm, then
    ``to_q`` / ``to_k`` / ``to_v``, softmax(q kᵀ / sqrt(C)) v, ``to_out.0``, plus the input).

    ``attention`` names the :func:`ditax.attention.attend` backend (``xla`` materialises the
    ``[L, L]`` scores of the ``L = Y·X`` pixels; ``blockwise`` holds one key block at a time)."""

    def __init__(self, dim: int, groups: int, *, dtype, rngs, attention: str = "xla"):
        self.attention = attention
        self.group_norm = GroupNorm(groups, dim, EPS, dtype=dtype)
        kw = dict(dtype=dtype, param_dtype=dtype, rngs=rngs)
        self.to_q = Linear(dim, dim, **kw)
        self.to_k = Linear(dim, dim, **kw)
        self.to_v = Linear(dim, dim, **kw)
        self.to_out = nnx.List([Linear(dim, dim, **kw)])

    def __call__(self, x: jax.Array) -> jax.Array:
        b, yy, xx, c = x.shape
        h = self.group_norm(x)
        if halo.active() is None:
            h = h.reshape(b, yy * xx, 1, c)                     # [B, L, N=1, K=C]
            o = attend(self.to_q(h), self.to_k(h), self.to_v(h), backend=self.attention)
        else:  # rows split over devices: this device's queries, the whole image's keys
            kv = halo.gather_rows(h).reshape(b, -1, 1, c)
            keep = halo.key_mask(yy, xx)
            o = attend(self.to_q(h.reshape(b, yy * xx, 1, c)), self.to_k(kv), self.to_v(kv),
                       backend=self.attention,
                       kv_mask=None if keep is None else jnp.broadcast_to(keep, (b, keep.size)))
        return self.to_out[0](o.reshape(b, yy, xx, c)) + x


class Downsample2D(nnx.Module):
    """Zero pad right and bottom by one, 3x3 conv with stride 2: ``[B, Y, X, C]`` →
    ``[B, Y/2, X/2, C]`` (even sizes)."""

    def __init__(self, dim: int, *, dtype, rngs):
        self.conv = Conv2d(dim, dim, 3, 2, ((0, 1), (0, 1)), dtype=dtype, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.conv(x)


class Upsample2D(nnx.Module):
    """Nearest 2x (each pixel repeated 2x2), then a 3x3 conv: ``[B, Y, X, C]`` →
    ``[B, 2Y, 2X, C]``."""

    def __init__(self, dim: int, *, dtype, rngs):
        self.conv = Conv2d(dim, dim, 3, dtype=dtype, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.conv(jnp.repeat(jnp.repeat(x, 2, axis=1), 2, axis=2))


def resnet_stack(cin: int, cout: int, layers: int, groups: int, *, dtype, rngs) -> nnx.List:
    """``layers`` residual blocks, the first ``cin → cout``, the others ``cout → cout``."""
    return nnx.List([ResnetBlock2D(cin if i == 0 else cout, cout, groups, dtype=dtype, rngs=rngs)
                     for i in range(layers)])


def run_stack(blocks, x: jax.Array) -> jax.Array:
    for block in blocks:
        x = block(x)
    return x


class DownEncoderBlock2D(nnx.Module):
    """``layers`` residual blocks ``cin → cout``, then a downsampler unless it is the last level."""

    def __init__(self, cin: int, cout: int, layers: int, groups: int, down: bool, *, dtype, rngs):
        self.resnets = resnet_stack(cin, cout, layers, groups, dtype=dtype, rngs=rngs)
        self.downsamplers = nnx.List([Downsample2D(cout, dtype=dtype, rngs=rngs)]) if down else None

    def __call__(self, x: jax.Array) -> jax.Array:
        x = run_stack(self.resnets, x)
        return x if self.downsamplers is None else self.downsamplers[0](x)


class UpDecoderBlock2D(nnx.Module):
    """``layers`` residual blocks ``cin → cout``, then an upsampler unless it is the last level."""

    def __init__(self, cin: int, cout: int, layers: int, groups: int, up: bool, *, dtype, rngs):
        self.resnets = resnet_stack(cin, cout, layers, groups, dtype=dtype, rngs=rngs)
        self.upsamplers = nnx.List([Upsample2D(cout, dtype=dtype, rngs=rngs)]) if up else None

    def __call__(self, x: jax.Array) -> jax.Array:
        x = run_stack(self.resnets, x)
        return x if self.upsamplers is None else self.upsamplers[0](x)


class UNetMidBlock2D(nnx.Module):
    """resnet → attention (when ``add_attention``) → resnet at the lowest resolution."""

    def __init__(self, dim: int, groups: int, add_attention: bool, *, dtype, rngs,
                 attention: str = "xla"):
        self.resnets = nnx.List([ResnetBlock2D(dim, dim, groups, dtype=dtype, rngs=rngs)
                                 for _ in range(2)])
        self.attentions = nnx.List([Attention(dim, groups, dtype=dtype, rngs=rngs,
                                              attention=attention)]) if add_attention else None

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.resnets[0](x)
        if self.attentions is not None:
            x = self.attentions[0](x)
        return self.resnets[1](x)


__all__ = ["Attention", "DownEncoderBlock2D", "Downsample2D", "ResnetBlock2D", "UNetMidBlock2D",
           "UpDecoderBlock2D", "Upsample2D", "resnet_stack", "run_stack"]
