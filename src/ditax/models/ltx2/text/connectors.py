"""LTX-2's text connectors in Flax NNX, equal to diffusers' ``LTX2TextConnectors``: Gemma's
stacked hidden states + the prompt mask → the video stream's and the audio stream's text
embeddings and the mask the transformer takes.

Steps (``__call__``):

1. features — LTX-2.0: :func:`masked_mean_norm` (each layer normalised over the prompt's real
   tokens, padding zeroed) then ``text_proj_in``; LTX-2.3: :func:`token_rms_norm` per (token,
   layer), padding zeroed, scaled by ``sqrt(width / C)`` per stream, then
   ``video_text_proj_in`` / ``audio_text_proj_in``;
2. each stream's :class:`Connector`: with learnable registers, the real tokens move to the
   front (in order) and the rest of the sequence is filled by the registers (tiled, indexed by
   absolute position), after which nothing is masked; without, padded keys are masked;
   1-D rotary positions ``p / base_seq_len`` (interleaved pairs or split halves per head),
   pre-norm blocks (RMS norms without gains), RMS norm out;
3. the mask returned is all ones: diffusers binarises the connector's additive mask with
   ``< 1e-6``, true for its zeros (registers) and for its large negative fill alike, so every
   position is valid for the transformer.

Shapes: B batch, T text tokens, C ``caption_channels``, F ``text_proj_in_factor`` (Gemma
layers + 1), D a stream's width (N heads × K head dim).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ditax.attention import attend
from ditax.errors import RequestError
from ditax.models.ltx2.text.config import LTX2ConnectorsConfig, StreamConfig
from ditax.nn.linear import Linear

EPS = 1e-6


def _rms(x, eps: float = EPS):
    """RMS norm over the last axis without a gain, float32 inside, ``x.dtype`` out."""
    xf = x.astype(jnp.float32)
    return (xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)).astype(x.dtype)


def valid_tokens(lengths, length: int, padding_side: str):
    """bool ``[B, T]``: the real tokens of prompts of ``lengths`` tokens padded to ``length``
    on ``padding_side`` (diffusers rebuilds the mask from the lengths, not the mask itself)."""
    pos = jnp.arange(length)[None, :]
    if padding_side == "right":
        return pos < lengths[:, None]
    if padding_side == "left":
        return pos >= length - lengths[:, None]
    raise ValueError(f"padding_side={padding_side!r}; expected 'left' or 'right'")


def masked_mean_norm(hidden, lengths, padding_side: str = "left", scale_factor: float = 8.0):
    """LTX-2.0's features: hidden ``[B, T, C, F]`` → ``[B, T, C·F]``, each (prompt, layer)
    shifted by its mean over the real tokens' channels and divided by their range (max − min),
    × ``scale_factor``; padded positions zero."""
    b, t, c, f = hidden.shape
    valid = valid_tokens(lengths, t, padding_side)
    m = valid[:, :, None, None]
    count = (lengths * c).astype(jnp.float32).reshape(b, 1, 1, 1)
    mean = jnp.sum(jnp.where(m, hidden, 0.0), axis=(1, 2), keepdims=True) / (count + EPS)
    lo = jnp.min(jnp.where(m, hidden, jnp.inf), axis=(1, 2), keepdims=True)
    hi = jnp.max(jnp.where(m, hidden, -jnp.inf), axis=(1, 2), keepdims=True)
    out = (hidden - mean) / (hi - lo + EPS) * scale_factor
    out = jnp.where(valid[:, :, None], out.reshape(b, t, c * f), 0.0)
    return out.astype(hidden.dtype)


def token_rms_norm(hidden):
    """LTX-2.3's features: hidden ``[B, T, C, F]`` RMS-normalised over C per (token, layer),
    in the input's dtype as diffusers computes it."""
    var = jnp.mean(hidden * hidden, axis=2, keepdims=True)
    return hidden * jax.lax.rsqrt(var + EPS)


def _linspace(steps: int, dtype) -> np.ndarray:
    """torch's ``linspace(0, 1, steps)`` bit for bit: a step rounded to ``dtype``, the first
    half stepped up from 0 and the second down from 1 (both ends exact), each value formed
    from the exact product (torch fuses the multiply-add) and rounded once to ``dtype``."""
    if steps == 1:
        return np.zeros(1, dtype)
    wide = np.float64 if dtype == np.float32 else np.longdouble
    step = wide(dtype(1.0) / dtype(steps - 1))
    i = np.arange(steps).astype(wide)
    return np.where(i < steps // 2, i * step, wide(1) - (steps - 1 - i) * step).astype(dtype)


def rope_tables(width: int, heads: int, length: int, base_seq_len: int, theta: float,
                double: bool, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """The connector's rotary tables for positions ``p / base_seq_len`` (host, float32):
    interleaved ``[T, D/2]`` (one frequency per channel pair ``(2i, 2i+1)``) or split
    ``[T, N, K/2]`` (head n's frequencies on its two halves). Frequencies
    ``theta**linspace(0, 1, D/2) · π/2`` in float64 (``double``) or float32, angles
    ``(2p/base − 1)·freq`` in float32, as diffusers computes them. With ``double`` the tables
    equal diffusers' to an ulp of cos / sin; in float32 torch's ``pow`` differs from the
    correctly rounded power by an ulp on ~2 % of the frequencies, which at LTX-2's width (the
    largest frequencies ~1.6e4 rad) moves those angles by up to ~1e-3."""
    ft = np.float64 if double else np.float32
    # theta**x rounded once to ft (torch's float32 pow is within an ulp of that)
    powers = (np.float64(theta) ** _linspace(width // 2, ft).astype(np.float64)).astype(ft)
    freqs = (powers * ft(math.pi) / ft(2.0)).astype(np.float32)
    grid = np.arange(length, dtype=np.float32) / np.float32(base_seq_len)
    angles = ((grid[:, None] * np.float32(2) - np.float32(1)) * freqs).astype(np.float64)
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    if kind == "interleaved":
        return cos, sin
    return cos.reshape(length, heads, -1), sin.reshape(length, heads, -1)


def apply_interleaved_rope(x, cos, sin):
    """Rotate the channel pairs ``(x[2i], x[2i+1])`` of x ``[B, T, D]`` by tables
    ``[T, D/2]``, in float32, rounded once to x's dtype."""
    b, t, d = x.shape
    xf = x.astype(jnp.float32).reshape(b, t, d // 2, 2)
    x0, x1 = xf[..., 0], xf[..., 1]
    c, s = cos[None], sin[None]
    return jnp.stack([x0 * c - x1 * s, x1 * c + x0 * s], axis=-1).reshape(b, t, d).astype(x.dtype)


def apply_split_rope(x, cos, sin):
    """Rotate-half per head: x ``[B, T, N, K]``, tables ``[T, N, K/2]``; ``out₁ = x₁cos −
    x₂sin``, ``out₂ = x₂cos + x₁sin`` in float32, rounded once to x's dtype."""
    half = x.shape[-1] // 2
    xf = x.astype(jnp.float32)
    x1, x2 = xf[..., :half], xf[..., half:]
    c, s = cos[None], sin[None]
    return jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1).astype(x.dtype)


class ConnectorAttention(nnx.Module):
    """Self-attention with RMS-normed q / k (one gain over all heads), 1-D rotary positions and
    optional per-head gates ``2·sigmoid(to_gate_logits(x))``: ``[B, T, D] → [B, T, D]``."""

    def __init__(self, s: StreamConfig, rope_type: str, dtype, rngs: nnx.Rngs):
        d = s.width
        lin = dict(dtype=dtype, param_dtype=dtype, rngs=rngs)
        self.to_q = Linear(d, d, **lin)
        self.to_k = Linear(d, d, **lin)
        self.to_v = Linear(d, d, **lin)
        self.to_out = Linear(d, d, **lin)
        self.norm_q = nnx.Param(jnp.ones((d,), dtype))
        self.norm_k = nnx.Param(jnp.ones((d,), dtype))
        self.to_gate_logits = Linear(d, s.heads, **lin) if s.gated else None
        self.heads, self.head_dim, self.rope_type = s.heads, s.head_dim, rope_type

    def __call__(self, x, cos, sin, kv_mask):
        b, t, d = x.shape
        n, k = self.heads, self.head_dim
        q = _rms(self.to_q(x)) * self.norm_q[...].astype(x.dtype)
        kk = _rms(self.to_k(x)) * self.norm_k[...].astype(x.dtype)
        v = self.to_v(x).reshape(b, t, n, k)
        if self.rope_type == "interleaved":   # over the full width, before the head split
            q = apply_interleaved_rope(q, cos, sin).reshape(b, t, n, k)
            kk = apply_interleaved_rope(kk, cos, sin).reshape(b, t, n, k)
        else:
            q = apply_split_rope(q.reshape(b, t, n, k), cos, sin)
            kk = apply_split_rope(kk.reshape(b, t, n, k), cos, sin)
        out = attend(q, kk, v, backend="xla", kv_mask=kv_mask)
        if self.to_gate_logits is not None:
            out = out * (2.0 * jax.nn.sigmoid(self.to_gate_logits(x)))[..., None]
        return self.to_out(out.reshape(b, t, d))


class ConnectorFeedForward(nnx.Module):
    """``proj_out(gelu_tanh(proj_in(x)))``, 4× wide (diffusers' ``FeedForward``)."""

    def __init__(self, d: int, dtype, rngs: nnx.Rngs):
        lin = dict(dtype=dtype, param_dtype=dtype, rngs=rngs)
        self.proj_in = Linear(d, 4 * d, **lin)
        self.proj_out = Linear(4 * d, d, **lin)

    def __call__(self, x):
        return self.proj_out(jax.nn.gelu(self.proj_in(x), approximate=True))


class ConnectorBlock(nnx.Module):
    """``x + attn1(rms(x))``, then ``x + ff(rms(x))`` (norms without gains)."""

    def __init__(self, s: StreamConfig, rope_type: str, dtype, rngs: nnx.Rngs):
        self.attn1 = ConnectorAttention(s, rope_type, dtype, rngs)
        self.ff = ConnectorFeedForward(s.width, dtype, rngs)

    def __call__(self, x, cos, sin, kv_mask):
        x = x + self.attn1(_rms(x), cos, sin, kv_mask)
        return x + self.ff(_rms(x))


class Connector(nnx.Module):
    """One stream's 1-D transformer (diffusers' ``LTX2ConnectorTransformer1d``)."""

    def __init__(self, s: StreamConfig, cfg: LTX2ConnectorsConfig, dtype, rngs: nnx.Rngs):
        self.learnable_registers = (nnx.Param(jax.random.uniform(
            rngs.params(), (s.registers, s.width), dtype, -1.0, 1.0)) if s.registers else None)
        self.transformer_blocks = nnx.List([ConnectorBlock(s, cfg.rope_type, dtype, rngs)
                                            for _ in range(s.layers)])
        self.stream = s
        self.rope = (cfg.connector_rope_base_seq_len, cfg.rope_theta, cfg.rope_double_precision,
                     cfg.rope_type)

    def __call__(self, x, valid):
        """x ``[B, T, D]``, valid bool ``[B, T]`` → ``[B, T, D]``."""
        b, t, d = x.shape
        kv_mask = valid
        if self.learnable_registers is not None:
            x = self._with_registers(x, valid)
            kv_mask = None                       # registers replace padding: nothing masked
        base, theta, double, kind = self.rope
        cos, sin = rope_tables(d, self.stream.heads, t, base, theta, double, kind)
        cos, sin = jnp.asarray(cos), jnp.asarray(sin)
        for block in self.transformer_blocks:
            x = block(x, cos, sin, kv_mask)
        return _rms(x)

    def _with_registers(self, x, valid):
        """The real tokens moved to the front in order; position p past them gets register
        ``p mod R``."""
        b, t, d = x.shape
        r = self.stream.registers
        if t % r:
            raise RequestError(f"connector: {t} text tokens are not a multiple of its {r} "
                             f"learnable registers; pad prompts to a multiple of {r}")
        regs = jnp.tile(self.learnable_registers[...], (t // r, 1)).astype(x.dtype)
        order = jnp.argsort(jnp.where(valid, 0, 1), axis=1, stable=True)
        front = jnp.take_along_axis(x, order[:, :, None], axis=1)
        count = jnp.sum(valid, axis=1)
        keep = (jnp.arange(t)[None, :] < count[:, None])[:, :, None]
        return jnp.where(keep, front, regs[None])


class LTX2TextConnectors(nnx.Module):
    """Stacked Gemma hidden states ``[B, T, C·F]`` (or ``[B, T, C, F]``) + mask ``[B, T]``
    → (video ``[B, T, Dv]``, audio ``[B, T, Da]``, mask int32 ``[B, T]``), as diffusers'
    ``LTX2TextConnectors.forward`` (the module docstring's steps)."""

    def __init__(self, cfg: LTX2ConnectorsConfig, *, rngs: nnx.Rngs):
        cfg.check()
        dt = jnp.dtype(cfg.dtype)
        self.cfg = cfg
        lin = dict(dtype=dt, param_dtype=dt, rngs=rngs, bias=cfg.proj_bias)
        if cfg.per_modality_projections:
            self.video_text_proj_in = Linear(cfg.text_dim, cfg.video_hidden_dim, **lin)
            self.audio_text_proj_in = Linear(cfg.text_dim, cfg.audio_hidden_dim, **lin)
        else:
            self.text_proj_in = Linear(cfg.text_dim, cfg.caption_channels, **lin)
        self.video_connector = Connector(cfg.video, cfg, dt, rngs)
        self.audio_connector = Connector(cfg.audio, cfg, dt, rngs)

    def __call__(self, hidden, attention_mask, padding_side: str = "left",
                 scale_factor: float = 8.0):
        cfg = self.cfg
        b, t = attention_mask.shape
        if hidden.shape[:2] != (b, t) or math.prod(hidden.shape[2:]) != cfg.text_dim:
            raise ValueError(f"connectors: text hidden states {tuple(hidden.shape)} do not fit "
                             f"mask {(b, t)} and caption_channels × text_proj_in_factor = "
                             f"{cfg.caption_channels} × {cfg.text_proj_in_factor}")
        x = hidden.reshape(b, t, cfg.caption_channels, cfg.text_proj_in_factor)
        valid = attention_mask > 0
        if cfg.per_modality_projections:
            feats = token_rms_norm(x).reshape(b, t, cfg.text_dim)
            feats = jnp.where(valid[:, :, None], feats, jnp.zeros((), feats.dtype))
            video_in = self.video_text_proj_in(
                feats * math.sqrt(cfg.video_hidden_dim / cfg.caption_channels))
            audio_in = self.audio_text_proj_in(
                feats * math.sqrt(cfg.audio_hidden_dim / cfg.caption_channels))
        else:
            lengths = jnp.sum(attention_mask, axis=-1)
            video_in = audio_in = self.text_proj_in(
                masked_mean_norm(x, lengths, padding_side, scale_factor))
        video = self.video_connector(video_in, valid)
        audio = self.audio_connector(audio_in, valid)
        return video, audio, jnp.ones((b, t), jnp.int32)


__all__ = ["LTX2TextConnectors", "Connector", "masked_mean_norm", "token_rms_norm",
           "valid_tokens", "rope_tables"]
