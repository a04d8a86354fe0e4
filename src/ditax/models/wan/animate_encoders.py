"""Wan 2.2 Animate's face path (diffusers ``transformer_wan_animate``): the motion encoder, the
face encoder and the face adapter, in Flax NNX.

- **motion encoder** (``motion_encoder``): one face crop ``[N, S, S, 3]`` (``S =
  motion_encoder_size``, pixels in [-1, 1], channels last) → a motion vector ``[N, E]``
  (``E = motion_encoder_dim``). Equalised-learning-rate convs (weights scaled by ``1 /
  sqrt(fan_in)``) with a fused leaky ReLU (bias, slope 0.2, gain sqrt 2); each residual block
  halves the size after a 4x4 FIR blur (``[1, 3, 3, 1]`` outer product, normalised);
  ``conv_out`` (4x4) leaves ``[N, style_dim]``; ``motion_blocks`` linears (no activation)
  give ``motion_dim`` coefficients ``a``; the vector is ``a @ Q^T`` with ``Q`` the QR basis of
  ``motion_synthesis_weight + 1e-8`` ``[E, motion_dim]`` (float32).
- **face encoder** (``face_encoder``): motion vectors per frame ``[B, T, E]`` → ``[B, T', n+1,
  D]``: causal (replicate-padded) 1-D convs over frames — ``conv1_local`` to ``n`` heads of
  ``hidden`` channels, then two stride-2 convs per head — each followed by a non-affine
  LayerNorm and SiLU, ``out_proj`` to D, and one learned padding token per frame
  (``T' = ceil(ceil(T / 2) / 2)``).
- **face adapter** (``face_adapter.{k}``): per latent frame, the frame's tokens attend to that
  frame's ``n + 1`` face tokens (LayerNorms without affine on both sides, q/k RMS-normed per
  head); its output is added to the tokens after main block ``k * inject_face_latents_blocks``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ditax.attention import attend
from ditax.nn import FP32LayerNorm, Linear, RMSNorm

BLUR = (1.0, 3.0, 3.0, 1.0)   # the FIR taps of the downsampling blocks


def _normal(rngs, shape, dtype):
    return nnx.Param(jax.random.normal(rngs.params(), shape, dtype))


def _conv(x, kernel, stride, padding, groups=1, dims=("NHWC", "HWIO", "NHWC")):
    pad = [padding] * (x.ndim - 2) if isinstance(padding[0], int) else padding
    return jax.lax.conv_general_dilated(
        x, kernel, (stride,) * (x.ndim - 2), pad, dimension_numbers=dims,
        feature_group_count=groups, precision=jax.lax.Precision.HIGHEST)


def fused_leaky_relu(x, bias):
    """``leaky_relu(x + bias, 0.2) * sqrt(2)`` (bias over the channels, the last axis)."""
    return jax.nn.leaky_relu(x + bias.astype(x.dtype), 0.2) * math.sqrt(2.0)   # weak: x's dtype


class MotionConv(nnx.Module):
    """A scaled 2-D conv (kernel ``[k, k, I, O]``), optional blur before it, then the fused
    leaky ReLU (its bias ``act_bias``; diffusers ``act_fn.bias``) or a plain ``bias``."""

    def __init__(self, cin, cout, k, *, stride=1, padding=0, bias=True, blur=False,
                 act=True, param_dtype, rngs):
        self.kernel = _normal(rngs, (k, k, cin, cout), param_dtype)
        self.act_bias = nnx.Param(jnp.zeros((cout,), param_dtype)) if act else None
        self.bias = nnx.Param(jnp.zeros((cout,), param_dtype)) if bias and not act else None
        self.scale = 1.0 / math.sqrt(cin * k * k)
        self.stride, self.padding, self.cin = stride, padding, cin
        self.blur_pad = None
        if blur:
            p = (len(BLUR) - stride) + (k - 1)
            self.blur_pad = ((p + 1) // 2, p // 2)

    def __call__(self, x):
        """x ``[N, H, W, I]`` → ``[N, H', W', O]``."""
        if self.blur_pad is not None:
            taps = np.asarray(BLUR, np.float32)
            k2 = np.outer(taps, taps) / np.outer(taps, taps).sum()
            k2 = jnp.asarray(np.broadcast_to(k2[:, :, None, None], k2.shape + (1, self.cin)),
                             x.dtype)
            x = _conv(x, k2, 1, [self.blur_pad, self.blur_pad], groups=self.cin)
        w = self.kernel[...].astype(x.dtype) * self.scale     # a Python float keeps x's dtype
        x = _conv(x, w, self.stride, (self.padding, self.padding))
        if self.act_bias is not None:
            return fused_leaky_relu(x, self.act_bias[...])
        return x if self.bias is None else x + self.bias[...].astype(x.dtype)


class MotionLinear(nnx.Module):
    """A scaled linear (``weight / sqrt(in)``, torch layout ``[out, in]`` kept) with bias."""

    def __init__(self, din, dout, *, param_dtype, rngs):
        self.weight = _normal(rngs, (dout, din), param_dtype)
        self.bias = nnx.Param(jnp.zeros((dout,), param_dtype))
        self.scale = 1.0 / math.sqrt(din)

    def __call__(self, x):
        w = self.weight[...].astype(x.dtype) * self.scale
        return x @ w.T + self.bias[...].astype(x.dtype)


class ResBlock(nnx.Module):
    """conv1 (3x3) → conv2 (blur, 3x3 stride 2) plus the blurred 1x1 stride-2 skip, / sqrt 2."""

    def __init__(self, cin, cout, *, param_dtype, rngs):
        kw = dict(param_dtype=param_dtype, rngs=rngs)
        self.conv1 = MotionConv(cin, cin, 3, padding=1, **kw)
        self.conv2 = MotionConv(cin, cout, 3, stride=2, blur=True, **kw)
        self.conv_skip = MotionConv(cin, cout, 1, stride=2, bias=False, blur=True, act=False,
                                    **kw)

    def __call__(self, x):
        return (self.conv2(self.conv1(x)) + self.conv_skip(x)) / math.sqrt(2.0)


class MotionEncoder(nnx.Module):
    """Face crops ``[N, S, S, 3]`` → motion vectors ``[N, E]`` (module docstring)."""

    def __init__(self, cfg, *, param_dtype, rngs):
        kw = dict(param_dtype=param_dtype, rngs=rngs)
        ch = {int(k): int(v) for k, v in cfg.motion_channels.items()}
        size = cfg.motion_encoder_size
        self.size = size
        self.conv_in = MotionConv(3, ch[size], 1, **kw)
        cin = ch[size]
        self.num_res = int(math.log2(size)) - 2
        for j in range(self.num_res):
            cout = ch[size // 2 ** (j + 1)]
            setattr(self, f"res_{j}", ResBlock(cin, cout, **kw))
            cin = cout
        self.conv_out = MotionConv(cin, cfg.motion_style_dim, 4, bias=False, act=False, **kw)
        self.num_linear = cfg.motion_blocks
        for j in range(cfg.motion_blocks):
            dout = cfg.motion_dim if j == cfg.motion_blocks - 1 else cfg.motion_style_dim
            setattr(self, f"linear_{j}", MotionLinear(cfg.motion_style_dim, dout, **kw))
        self.motion_synthesis_weight = _normal(rngs, (cfg.motion_encoder_dim, cfg.motion_dim),
                                               param_dtype)

    def __call__(self, x):
        x = self.conv_in(x)
        for j in range(self.num_res):
            x = getattr(self, f"res_{j}")(x)
        a = self.conv_out(x).reshape(x.shape[0], -1)                      # [N, style_dim]
        for j in range(self.num_linear):
            a = getattr(self, f"linear_{j}")(a)                           # → [N, motion_dim]
        q = jnp.linalg.qr(self.motion_synthesis_weight[...].astype(jnp.float32) + 1e-8)[0]
        return (a.astype(jnp.float32) @ q.T).astype(x.dtype)              # [N, E]


class FaceEncoder(nnx.Module):
    """Motion vectors ``[B, T, E]`` → face tokens ``[B, T', n + 1, D]`` (module docstring)."""

    def __init__(self, cfg, *, dtype, param_dtype, rngs):
        e, hid, n, d = (cfg.motion_encoder_dim, cfg.face_encoder_hidden_dim,
                        cfg.face_encoder_num_heads, cfg.inner_dim)
        self.heads, self.hidden, self.eps = n, hid, cfg.eps
        self.conv1_kernel = _normal(rngs, (3, e, hid * n), param_dtype)       # [k, I, O]
        self.conv1_bias = nnx.Param(jnp.zeros((hid * n,), param_dtype))
        self.conv2_kernel = _normal(rngs, (3, hid, hid), param_dtype)
        self.conv2_bias = nnx.Param(jnp.zeros((hid,), param_dtype))
        self.conv3_kernel = _normal(rngs, (3, hid, hid), param_dtype)
        self.conv3_bias = nnx.Param(jnp.zeros((hid,), param_dtype))
        self.norm = FP32LayerNorm(hid, cfg.eps, affine=False, param_dtype=param_dtype)
        self.out_proj = Linear(hid, d, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.padding_tokens = nnx.Param(jnp.zeros((1, 1, 1, d), param_dtype))

    def _causal(self, x, name, stride):
        k = getattr(self, f"{name}_kernel")[...].astype(x.dtype)
        x = jnp.pad(x, ((0, 0), (k.shape[0] - 1, 0), (0, 0)), mode="edge")
        x = _conv(x, k, stride, (0, 0), dims=("NWC", "WIO", "NWC"))
        return x + getattr(self, f"{name}_bias")[...].astype(x.dtype)

    def __call__(self, x):
        b, t, _ = x.shape
        dt = x.dtype
        x = self._causal(x, "conv1", 1)                                   # [B, T, n*hid]
        x = x.reshape(b, t, self.heads, self.hidden).transpose(0, 2, 1, 3)
        x = x.reshape(b * self.heads, t, self.hidden)
        x = jax.nn.silu(self.norm(x).astype(dt))
        x = jax.nn.silu(self.norm(self._causal(x, "conv2", 2)).astype(dt))
        x = jax.nn.silu(self.norm(self._causal(x, "conv3", 2)).astype(dt))
        x = self.out_proj(x)                                              # [B*n, T', D]
        x = x.reshape(b, self.heads, x.shape[1], -1).transpose(0, 2, 1, 3)   # [B, T', n, D]
        pad = jnp.broadcast_to(self.padding_tokens[...].astype(dt), (b, x.shape[1], 1,
                                                                     x.shape[-1]))
        return jnp.concatenate([x, pad], axis=2)


def face_frames_out(frames: int) -> int:
    """``T'``: face-encoder frames of ``frames`` face frames (two stride-2 causal convs)."""
    t = frames
    for _ in range(2):
        t = (t - 1) // 2 + 1
    return t


class FaceAdapter(nnx.Module):
    """Tokens of each latent frame attend to that frame's face tokens (module docstring)."""

    def __init__(self, cfg, *, dtype, param_dtype, rngs):
        d, n = cfg.inner_dim, cfg.num_attention_heads
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.to_q, self.to_k, self.to_v, self.to_out = (Linear(d, d, **kw) for _ in range(4))
        self.norm_q = RMSNorm(d // n, cfg.eps, param_dtype=param_dtype)
        self.norm_k = RMSNorm(d // n, cfg.eps, param_dtype=param_dtype)
        self.pre_norm = FP32LayerNorm(d, cfg.eps, affine=False, param_dtype=param_dtype)
        self.heads = n

    def __call__(self, h, face):
        """h ``[B, L, D]`` (``L = F·Y·X`` tokens, frame-major), face ``[B, F, n+1, D]`` →
        the update ``[B, L, D]``."""
        b, length, d = h.shape
        _, f, m, _ = face.shape
        n, dt = self.heads, h.dtype
        q = self.to_q(self.pre_norm(h).astype(dt)).reshape(b, length, n, d // n)
        kv = self.pre_norm(face).astype(dt).reshape(b, f * m, d)
        k = self.to_k(kv).reshape(b * f, m, n, d // n)
        v = self.to_v(kv).reshape(b * f, m, n, d // n)
        q = self.norm_q(q).reshape(b * f, length // f, n, d // n)
        o = attend(q, self.norm_k(k), v, backend="xla")              # [B*F, L/F, N, K]
        return self.to_out(o.reshape(b, length, d))


__all__ = ["BLUR", "FaceAdapter", "FaceEncoder", "MotionConv", "MotionEncoder",
           "MotionLinear", "ResBlock", "face_frames_out", "fused_leaky_relu"]
