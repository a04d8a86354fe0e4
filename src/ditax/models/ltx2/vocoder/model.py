"""LTX-2's vocoder (diffusers ``LTX2Vocoder``, a HiFi-GAN / BigVGAN generator) in Flax NNX: a
mel spectrogram ``[B, C, T, M]`` (the audio VAE's decode) → waveform ``[B, out_channels,
T x prod(upsample_factors)]`` at ``config.sample_rate``.

``conv_in`` (7 taps) → per upsampler: (leaky ReLU) → transposed conv (width halves, length x
factor) → the mean of ``len(resnet_kernel_sizes)`` residual blocks run side by side → final
activation (leaky ReLU of slope 0.01, or an anti-aliased SnakeBeta) → ``conv_out`` (7 taps) →
tanh / clamp / nothing. A residual block adds, per dilation d, ``conv2(act2(conv1_d(act1(x))))``.
Inside, signals are channels-last ``[B, S, C]``; the mel's channels and bins become the
``C x M`` input features channel-major, as diffusers flattens them.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.errors import RequestError
from ditax.models.ltx2.vocoder.config import LTX2VocoderConfig
from ditax.models.ltx2.vocoder.layers import (AntiAliasAct, Conv1d, ConvTranspose1d, LeakyReLU,
                                              SnakeBeta)

OUT_SLOPE = 0.01   # the leaky ReLU before conv_out ignores the config's slope, as diffusers


def activation(cfg: LTX2VocoderConfig, dim: int, *, dtype) -> nnx.Module:
    """A residual block's activation: leaky ReLU, Snake or SnakeBeta, anti-aliased when
    ``cfg.antialias``."""
    if cfg.act_fn == "leaky_relu":
        act = LeakyReLU(cfg.leaky_relu_negative_slope)
    else:
        act = SnakeBeta(dim, use_beta=cfg.act_fn == "snakebeta", dtype=dtype)
    if cfg.antialias:
        act = AntiAliasAct(act, cfg.antialias_ratio, cfg.antialias_kernel_size, dtype=dtype)
    return act


class ResBlock(nnx.Module):
    """Per dilation d: ``x += conv2(act2(conv1_d(act1(x))))`` with "same" padding:
    ``[B, S, C]`` → ``[B, S, C]``."""

    def __init__(self, cfg: LTX2VocoderConfig, dim: int, kernel: int, dilations, *, dtype, rngs):
        kw = dict(dtype=dtype, rngs=rngs)
        self.convs1 = nnx.List([Conv1d(dim, dim, kernel, dilation=d, **kw) for d in dilations])
        self.acts1 = nnx.List([activation(cfg, dim, dtype=dtype) for _ in dilations])
        self.convs2 = nnx.List([Conv1d(dim, dim, kernel, **kw) for _ in dilations])
        self.acts2 = nnx.List([activation(cfg, dim, dtype=dtype) for _ in dilations])

    def __call__(self, x: jax.Array) -> jax.Array:
        for act1, conv1, act2, conv2 in zip(self.acts1, self.convs1, self.acts2, self.convs2):
            x = x + conv2(act2(conv1(act1(x))))
        return x


class LTX2Vocoder(nnx.Module):
    """diffusers ``LTX2Vocoder`` (``dtype``: parameters, buffers and compute). ``__call__``
    takes the mel as diffusers does; :meth:`generate` is the traced channels-last piece."""

    def __init__(self, config: LTX2VocoderConfig, *, dtype=jnp.float32, rngs: nnx.Rngs):
        config.validate()
        self.config = config
        self.dtype = jnp.dtype(dtype)
        kw = dict(dtype=dtype, rngs=rngs)
        self.conv_in = Conv1d(config.in_channels, config.hidden_channels, 7, **kw)
        ups, resnets, width = [], [], config.hidden_channels
        for k, s in zip(config.upsample_kernel_sizes, config.upsample_factors):
            ups.append(ConvTranspose1d(width, width // 2, k, s, (k - s) // 2, **kw))
            width //= 2
            resnets += [ResBlock(config, width, rk, d, **kw)
                        for rk, d in zip(config.resnet_kernel_sizes, config.resnet_dilations)]
        self.upsamplers = nnx.List(ups)
        self.resnets = nnx.List(resnets)
        if config.act_fn == "leaky_relu":
            self.act_out = LeakyReLU(OUT_SLOPE)
        else:   # always SnakeBeta (with beta) and always anti-aliased, as diffusers
            self.act_out = AntiAliasAct(SnakeBeta(width, True, dtype=dtype),
                                        config.antialias_ratio, config.antialias_kernel_size,
                                        dtype=dtype)
        self.conv_out = Conv1d(width, config.out_channels, 7, bias=config.final_bias, **kw)

    @property
    def sample_rate(self) -> int:
        """Samples per second of the waveform (``output_sampling_rate``)."""
        return self.config.sample_rate

    def generate(self, x: jax.Array) -> jax.Array:
        """Mel features ``[B, T, in_channels]`` → waveform ``[B, T x prod(factors), out_channels]``
        (channels-last; traced, for jit, grad and the BWE vocoder)."""
        cfg, per = self.config, len(self.config.resnet_kernel_sizes)
        x = self.conv_in(x)
        for i, up in enumerate(self.upsamplers):
            if cfg.act_fn == "leaky_relu":     # the snake kinds act inside the blocks only
                x = jax.nn.leaky_relu(x, cfg.leaky_relu_negative_slope)
            x = up(x)
            x = jnp.mean(jnp.stack([self.resnets[j](x) for j in range(i * per, (i + 1) * per)]),
                         axis=0)
        x = self.conv_out(self.act_out(x))
        if cfg.final_act_fn == "tanh":
            return jnp.tanh(x)
        if cfg.final_act_fn == "clamp":
            return jnp.clip(x, -1.0, 1.0)
        return x

    def features(self, mel, time_last: bool = False) -> jax.Array:
        """A mel ``[B, C, T, M]`` (``[B, C, M, T]`` with ``time_last``) → ``[B, T, C x M]``
        channel-major, checked against ``in_channels``."""
        shape, cin = tuple(jnp.shape(mel)), self.config.in_channels
        layout = "[B, C, M, T]" if time_last else "[B, C, T, M]"
        if len(shape) != 4 or 0 in shape or shape[1] * shape[2 if time_last else 3] != cin:
            raise RequestError(f"vocoder: expected a mel {layout} with C x M = {cin} features "
                               f"and no empty axis, got shape {shape}; pass the audio VAE's "
                               "decoded mel as it is")
        x = jnp.asarray(mel, self.dtype)
        x = jnp.transpose(x, (0, 3, 1, 2) if time_last else (0, 2, 1, 3))    # [B, T, C, M]
        return x.reshape(shape[0], x.shape[1], cin)

    def __call__(self, mel, time_last: bool = False) -> jax.Array:
        """Waveform ``[B, out_channels, T x prod(upsample_factors)]`` of a mel ``[B, C, T, M]``
        (diffusers' call; ``time_last``: the mel is ``[B, C, M, T]``)."""
        y = generate_program(*nnx.split(self), self.features(mel, time_last))
        return jnp.transpose(y, (0, 2, 1))


@functools.partial(jax.jit, static_argnames=("graphdef",))
def generate_program(graphdef, state, x: jax.Array) -> jax.Array:
    """``[B, T, in_channels]`` → ``[B, S, out_channels]`` through :meth:`LTX2Vocoder.generate`."""
    return nnx.merge(graphdef, state).generate(x)


__all__ = ["LTX2Vocoder", "ResBlock", "activation", "generate_program"]
