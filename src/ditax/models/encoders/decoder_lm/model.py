"""The decoder-LM text stack in Flax NNX: token ids + padding mask → every layer's hidden
states, as transformers returns them with ``output_hidden_states=True``.

Numerically follows transformers' Gemma-3 / Qwen3 / Mistral text models (the switches are
:class:`~ditax.models.encoders.decoder_lm.config.DecoderLMConfig`'s):

- positions are ``0 .. T-1`` whatever the padding (transformers' default ``position_ids``), so
  a left-padded prompt's first real token sits at position ``T - len``;
- a query attends to keys at or before it that are real tokens (the padding mask), and in a
  sliding layer only to the last ``sliding_window`` of them (``q - s < W``);
- a query with no key to attend to (a left pad: everything before it is padding) gets a zero
  attention output, as torch's SDPA gives it (the default attention of the pipelines);
  such rows are padding and the pipelines never read them;
- logits are computed in the dtype with a float32 result and the softmax runs in float32.

The layers are one stacked module (:func:`ditax.nn.stack.make_stack`) run under a scan: the
full and sliding layers share parameters' shapes and differ only in their mask window and
rotary table, which the scan picks per layer by an index. Projections are
:class:`ditax.nn.Linear` s, so ``quantize="int8"`` stores them in 8 bits
(:mod:`ditax.nn.quant`). Shapes: B batch, T text tokens, D ``hidden_size``, N query heads,
G key/value heads, R = N/G queries per key head, K ``head_dim``, M ``intermediate_size``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ditax.models.encoders.decoder_lm.config import DecoderLMConfig, compute_dtype
from ditax.models.encoders.decoder_lm.rope import apply_rotate_half, rotate_half_tables
from ditax.models.encoders.inputs import token_mask
from ditax.nn.activations import ACTIVATIONS
from ditax.nn.linear import Linear
from ditax.nn.offload import on_device
from ditax.nn.stack import make_stack


class LMNorm(nnx.Module):
    """RMS norm over the last axis, statistics in float32. ``kind="gemma"``: ``x̂·(1 + w)``
    in float32, then the dtype (weights zero at init); ``"llama"``: ``w·x̂`` with ``x̂``
    rounded to the dtype first (weights one at init)."""

    def __init__(self, dim: int, eps: float, kind: str, dtype):
        init = jnp.zeros if kind == "gemma" else jnp.ones
        self.weight = nnx.Param(init((dim,), dtype))
        self.eps = eps
        self.kind = kind

    def __call__(self, x):
        xf = x.astype(jnp.float32)
        y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        if self.kind == "gemma":
            return (y * (1.0 + self.weight[...].astype(jnp.float32))).astype(x.dtype)
        return self.weight[...].astype(x.dtype) * y.astype(x.dtype)


class LMAttention(nnx.Module):
    """Causal grouped-query self-attention with rotary positions and optional q/k norms."""

    def __init__(self, cfg: DecoderLMConfig, rngs: nnx.Rngs):
        dt = compute_dtype(cfg.dtype)
        d, n, g, k = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        lin = dict(dtype=dt, param_dtype=dt, rngs=rngs, bias=cfg.attention_bias)
        self.q_proj = Linear(d, n * k, **lin)
        self.k_proj = Linear(d, g * k, **lin)
        self.v_proj = Linear(d, g * k, **lin)
        self.o_proj = Linear(n * k, d, **lin)
        norm = (lambda: LMNorm(k, cfg.rms_norm_eps, cfg.norm, dt)) if cfg.qk_norm else None
        self.q_norm = norm() if norm else None
        self.k_norm = norm() if norm else None
        self.heads, self.kv_heads, self.head_dim = n, g, k
        self.scale = cfg.scale
        self.softcap = cfg.attn_softcap

    def __call__(self, x, cos, sin, allowed):
        """x ``[B, T, D]``, tables ``[T, K]``, allowed bool ``[B, T, T]`` (query, key) →
        ``[B, T, D]``."""
        b, t, _ = x.shape
        n, g, k = self.heads, self.kv_heads, self.head_dim
        q = self.q_proj(x).reshape(b, t, n, k)
        kk = self.k_proj(x).reshape(b, t, g, k)
        v = self.v_proj(x).reshape(b, t, g, k)
        if self.q_norm is not None:
            q, kk = self.q_norm(q), self.k_norm(kk)
        q = apply_rotate_half(q, cos, sin).reshape(b, t, g, n // g, k)
        kk = apply_rotate_half(kk, cos, sin)
        # query head h reads key head h // R (transformers' repeat_kv)
        logits = jnp.einsum("bqgrk,bsgk->bgrqs", q, kk, preferred_element_type=jnp.float32)
        logits = logits * self.scale
        if self.softcap is not None:
            logits = jnp.tanh(logits / self.softcap) * self.softcap
        keep = allowed[:, None, None]
        probs = jax.nn.softmax(jnp.where(keep, logits, jnp.finfo(jnp.float32).min), axis=-1)
        probs = jnp.where(keep, probs, 0.0).astype(x.dtype)   # no key at all: a zero output
        out = jnp.einsum("bgrqs,bsgk->bqgrk", probs, v).reshape(b, t, n * k)
        return self.o_proj(out)


class LMMLP(nnx.Module):
    """Gated MLP ``down(act(gate(x)) · up(x))``, bias-free: ``[B, T, D] → [B, T, D]``."""

    def __init__(self, cfg: DecoderLMConfig, rngs: nnx.Rngs):
        dt = compute_dtype(cfg.dtype)
        lin = dict(dtype=dt, param_dtype=dt, rngs=rngs, bias=False)
        self.gate_proj = Linear(cfg.hidden_size, cfg.intermediate_size, **lin)
        self.up_proj = Linear(cfg.hidden_size, cfg.intermediate_size, **lin)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, **lin)
        self.act = ACTIVATIONS[cfg.activation]

    def __call__(self, x):
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class LMBlock(nnx.Module):
    """Pre-norm residual block; with ``sandwich_norm`` each branch is also normed on its way
    out (Gemma 2/3). Norm names are Gemma's (a Llama-style checkpoint's
    ``post_attention_layernorm`` is our ``pre_feedforward_layernorm``)."""

    def __init__(self, cfg: DecoderLMConfig, rngs: nnx.Rngs):
        dt = compute_dtype(cfg.dtype)
        norm = lambda: LMNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.norm, dt)  # noqa: E731
        self.input_layernorm = norm()
        self.self_attn = LMAttention(cfg, rngs)
        self.post_attention_layernorm = norm() if cfg.sandwich_norm else None
        self.pre_feedforward_layernorm = norm()
        self.mlp = LMMLP(cfg, rngs)
        self.post_feedforward_layernorm = norm() if cfg.sandwich_norm else None

    def __call__(self, x, cos, sin, allowed):
        h = self.self_attn(self.input_layernorm(x), cos, sin, allowed)
        if self.post_attention_layernorm is not None:
            h = self.post_attention_layernorm(h)
        x = x + h
        h = self.mlp(self.pre_feedforward_layernorm(x))
        if self.post_feedforward_layernorm is not None:
            h = self.post_feedforward_layernorm(h)
        return x + h


class DecoderLM(nnx.Module):
    """ids ``[B, T]`` + padding mask ``[B, T]`` → hidden states ``[L+1, B, T, D]``: the
    (scaled) embeddings, then each layer's output, the last one after the final norm — the
    ``hidden_states`` tuple of transformers' text model, stacked."""

    def __init__(self, cfg: DecoderLMConfig, *, rngs: nnx.Rngs):
        cfg.check()
        dt = compute_dtype(cfg.dtype)
        self.cfg = cfg
        self.embed_tokens = nnx.Param(nnx.initializers.normal(1.0)(
            rngs.params(), (cfg.vocab_size, cfg.hidden_size), dt))
        self.layers = make_stack(lambda r: LMBlock(cfg, r), cfg.num_layers, rngs)
        self.norm = LMNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.norm, dt)

    @property
    def block_stacks(self) -> tuple[tuple[str, int], ...]:
        """The stacked blocks whose linears ``quantize=`` stores in 8 bits."""
        return (("layers", self.cfg.num_layers),)

    def embed(self, input_ids):
        """ids ``[B, T]`` → embeddings ``[B, T, D]`` (× ``sqrt(D)`` rounded to the dtype where
        the config says so)."""
        table = self.embed_tokens[...]
        x = jnp.take(table, input_ids, axis=0)
        if self.cfg.embed_scale:
            x = x * jnp.asarray(np.float32(self.cfg.hidden_size ** 0.5)).astype(table.dtype)
        return x

    @on_device     # weights kept in host memory (text_offload): on the device for the call
    def __call__(self, input_ids, attention_mask=None):
        input_ids = jnp.asarray(input_ids)
        if input_ids.ndim != 2 or not jnp.issubdtype(input_ids.dtype, jnp.integer):
            raise ValueError(f"input_ids must be integer [B, T]; got {input_ids.dtype} "
                             f"{tuple(input_ids.shape)}")
        b, t = input_ids.shape
        valid = token_mask(input_ids, attention_mask)
        cfg = self.cfg
        x0 = self.embed(input_ids)
        cos, sin = self._tables(t, x0.dtype)
        # the window of each layer kind: full layers see every earlier key
        windows = jnp.asarray([t + 1, cfg.sliding_window or t + 1], jnp.int32)
        offset = jnp.arange(t)[:, None] - jnp.arange(t)[None, :]          # q - s
        causal = (offset >= 0)[None] & valid[:, None, :]                    # [B, T, T]

        @nnx.scan(in_axes=(nnx.Carry, 0, 0), out_axes=(nnx.Carry, 0))
        def run(x, block, kind):
            allowed = causal & (offset < windows[kind])[None]
            x = block(x, cos[kind], sin[kind], allowed)
            return x, x

        x, outs = run(x0, self.layers, jnp.asarray(cfg.kind_index, jnp.int32))
        return jnp.concatenate([x0[None], outs[:-1], self.norm(x)[None]], axis=0)

    def _tables(self, t: int, dtype):
        """cos / sin ``[2, T, K]`` (full, sliding) in ``dtype``, as transformers rounds them."""
        cfg = self.cfg
        full = rotate_half_tables(cfg.rope_full, cfg.head_dim, t)
        sliding = (full if cfg.rope_sliding is None
                   else rotate_half_tables(cfg.rope_sliding, cfg.head_dim, t))
        return tuple(jnp.asarray(np.stack([f, s])).astype(dtype)
                     for f, s in zip(full, sliding))


@nnx.jit
def hidden_states(model: DecoderLM, input_ids, attention_mask):
    """:meth:`DecoderLM.__call__` compiled once per input shape."""
    return model(input_ids, attention_mask)


__all__ = ["LMNorm", "LMAttention", "LMMLP", "LMBlock", "DecoderLM", "hidden_states"]
