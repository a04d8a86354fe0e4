"""LTX-2's block in Flax NNX (diffusers ``LTX2VideoTransformerBlock``).

One block updates the video tokens ``x [B, L', D]`` and the audio tokens ``a [B, La, Da]``:

1. self-attention of each stream (adaLN: shift / scale / gate of the stream's timestep
   terms, RMS norm without gains unless ``norm_elementwise_affine``);
2. text cross-attention of each stream — with ``cross_attn_mod`` (LTX-2.3) the query input
   is modulated and the output gated by three more timestep terms, and the text keys /
   values modulated by the per-block prompt table (plus ``sigma``'s terms when
   ``use_prompt_adaln_single``);
3. audio→video (video queries, audio keys) and video→audio (audio queries, video keys)
   cross-attention, ``N_a`` heads of ``K_a``, each side modulated by its per-block table plus
   the model-wide a↔v terms, gated; skipped under ``isolate_modalities``;
4. feed-forward of each stream (GELU tanh, ``4·width``).

Modulation, norms and residual updates run in float32 and are cast back to the compute dtype.
What the blocks read besides the tokens is :class:`BlockContext` (built once per call by the
transformer); attention runs through :class:`Calls` (the model's resolved attention sites).
Remat names: ``attn_out`` (every attention output), ``proj_out`` (output projections and the
feed-forwards' ``net.2``), ``proj_in`` (the feed-forwards' ``net.0.proj``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from ditax.attention import AttentionCall
from ditax.models.ltx2.transformer.attention import Attention
from ditax.models.ltx2.config import MLP_RATIO, LTX2Config
from ditax.models.ltx2.transformer.embeddings import mod_terms, modulate
from ditax.models.ltx2.transformer.rope import Rope
from ditax.nn import Linear
from ditax.parallel.sharding import ShardingContext

VIDEO = ("act_batch", "act_seq", "act_embed")
AUDIO = ("act_batch", None, "act_embed")


class Calls(NamedTuple):
    """The attention sites of a block: video self-attention (the configured backend; ulysses /
    ring over the context axis), video→text cross-attention, and the audio-headed ones —
    audio self-attention (the local kernel), audio→text, audio→video and video→audio
    (the cross-attention kernel: queries split over the context axis, keys whole)."""

    video_self: AttentionCall
    video_text: AttentionCall
    audio_self: AttentionCall
    audio_cross: AttentionCall


class BlockContext(NamedTuple):
    """What every block reads besides the tokens (float32 unless said):

    - ``temb [B, Tv, n·D]``, ``temb_audio [B, Ta, n·Da]`` — the streams' timestep terms
      (compute dtype; ``Tv`` 1 or ``L'``, ``Ta`` 1 or ``La``);
    - ``ca_video [B, Tv, 4·D]``, ``ca_audio [B, Ta, 4·Da]``, ``gate_video [B, Tv, D]``,
      ``gate_audio [B, Ta, Da]`` — the model-wide a↔v scale / shift and gate terms;
    - ``prompt``, ``prompt_audio`` — ``sigma``'s prompt terms ``[B, 1, 2·D]`` (None: the
      per-block tables alone);
    - ``text [B, T, D]``, ``audio_text [B, Ta', Da]`` and their key masks (None: all);
    - RoPE tables: ``rope`` (video), ``audio_rope``, ``cross_rope`` (video side of the a↔v
      attentions), ``audio_cross_rope``;
    - ``token_mask [B, L']``: the real video tokens (None: no padding);
    - ``stg``: spatio-temporal guidance, ``(flags [num_layers] bool, weights [B] float32)``
      — the blocks whose self-attentions are perturbed and each sample's blend weight
      (0: the values alone); None: none;
    - ``isolate``: skip the a↔v attentions (static).
    """

    temb: Any
    temb_audio: Any
    ca_video: Any
    ca_audio: Any
    gate_video: Any
    gate_audio: Any
    prompt: Any
    prompt_audio: Any
    text: Any
    audio_text: Any
    text_mask: Any
    audio_text_mask: Any
    rope: Rope
    audio_rope: Rope
    cross_rope: Rope
    audio_cross_rope: Rope
    token_mask: Any
    stg: Any = None
    isolate: bool = False


class Norm(nnx.Module):
    """diffusers' ``RMSNorm`` over the last axis, float32 out (gains only with
    ``norm_elementwise_affine``)."""

    def __init__(self, dim: int, eps: float, affine: bool, param_dtype):
        self.eps = eps
        self.weight = nnx.Param(jnp.ones((dim,), jnp.dtype(param_dtype))) if affine else None

    def __call__(self, x):
        xf = x.astype(jnp.float32)
        y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        if self.weight is not None:
            y = y * self.weight[...].astype(jnp.float32)
        return y


class FeedForward(nnx.Module):
    """``net.0.proj → GELU(tanh) → net.2`` (diffusers ``FeedForward``, gelu-approximate)."""

    def __init__(self, dim: int, bias: bool, *, dtype, param_dtype, rngs):
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs, bias=bias)
        self.proj_in = Linear(dim, dim * MLP_RATIO, **kw)     # diffusers: net.0.proj
        self.proj_out = Linear(dim * MLP_RATIO, dim, **kw)    # diffusers: net.2

    def __call__(self, x, sharding: ShardingContext, seq):
        h = checkpoint_name(self.proj_in(x), "proj_in")
        h = sharding.constrain(jax.nn.gelu(h, approximate=True), ("act_batch", seq, "act_mlp"))
        return checkpoint_name(self.proj_out(h), "proj_out")


def _residual(x, h, gate=None):
    """``x + gate · h`` (or ``x + h``) in float32, in ``x``'s dtype."""
    h = h.astype(jnp.float32)
    return (x.astype(jnp.float32) + (h if gate is None else h * gate)).astype(x.dtype)


class Block(nnx.Module):
    """One LTX-2 block on ``(video [B, L', D], audio [B, La, Da])`` (module docstring)."""

    def __init__(self, cfg: LTX2Config, *, rngs):
        d, da = cfg.inner_dim, cfg.audio_inner_dim
        n, k = cfg.num_attention_heads, cfg.attention_head_dim
        na, ka = cfg.audio_num_attention_heads, cfg.audio_attention_head_dim
        pd = jnp.dtype(cfg.param_dtype)
        kw = dict(dtype=cfg.dtype, param_dtype=pd, rngs=rngs)
        att = dict(bias=cfg.attention_bias, out_bias=cfg.attention_out_bias, **kw)
        norm = lambda dim: Norm(dim, cfg.norm_eps, cfg.norm_elementwise_affine, pd)  # noqa: E731
        self.norm1, self.audio_norm1 = norm(d), norm(da)
        self.attn1 = Attention(d, d, n, k, gated=cfg.gated_attn, **att)
        self.audio_attn1 = Attention(da, da, na, ka, gated=cfg.audio_gated_attn, **att)
        self.norm2, self.audio_norm2 = norm(d), norm(da)
        self.attn2 = Attention(d, cfg.cross_attention_dim, n, k, gated=cfg.gated_attn, **att)
        self.audio_attn2 = Attention(da, cfg.audio_cross_attention_dim, na, ka,
                                     gated=cfg.audio_gated_attn, **att)
        self.audio_to_video_norm, self.video_to_audio_norm = norm(d), norm(da)
        self.audio_to_video_attn = Attention(d, da, na, ka, gated=cfg.gated_attn, **att)
        self.video_to_audio_attn = Attention(da, d, na, ka, gated=cfg.audio_gated_attn, **att)
        self.norm3, self.audio_norm3 = norm(d), norm(da)
        self.ff = FeedForward(d, cfg.ff_bias, **kw)
        self.audio_ff = FeedForward(da, cfg.audio_ff_bias, **kw)

        def table(rows, dim, scale):
            return nnx.Param(jax.random.normal(rngs.params(), (rows, dim), pd) * scale)

        self.scale_shift_table = table(cfg.video_mod_params, d, d ** -0.5)
        self.audio_scale_shift_table = table(cfg.audio_mod_params, da, da ** -0.5)
        if cfg.prompt_modulation:
            self.prompt_scale_shift_table = table(2, d, 1.0)
            self.audio_prompt_scale_shift_table = table(2, da, 1.0)
        else:
            self.prompt_scale_shift_table = self.audio_prompt_scale_shift_table = None
        self.video_a2v_cross_attn_scale_shift_table = table(5, d, 1.0)
        self.audio_a2v_cross_attn_scale_shift_table = table(5, da, 1.0)
        self.video_text_mod = cfg.cross_attn_mod
        self.audio_text_mod = cfg.audio_cross_attn_mod
        self.split_rope = cfg.rope_type == "split"

    def __call__(self, streams, ctx: BlockContext, calls: Calls, sharding: ShardingContext,
                 perturb=None):
        """``streams = (video, audio)`` after the block; ``perturb [B]``: this block's STG
        blend weights of the self-attentions (None: not perturbed)."""
        x, a = streams
        c = ctx
        vm = mod_terms(self.scale_shift_table[...], c.temb)
        am = mod_terms(self.audio_scale_shift_table[...], c.temb_audio)
        split = self.split_rope

        # 1. self-attention
        h = modulate(self.norm1(x), vm[0], vm[1]).astype(x.dtype)
        o = self.attn1(h, h, calls.video_self, sharding, q_rope=c.rope, kv_mask=c.token_mask,
                       split_rope=split, perturb=perturb)
        x = sharding.constrain(_residual(x, o, vm[2]), VIDEO)
        h = modulate(self.audio_norm1(a), am[0], am[1]).astype(a.dtype)
        o = self.audio_attn1(h, h, calls.audio_self, sharding, q_rope=c.audio_rope,
                             split_rope=split, seq=(None, None), perturb=perturb)
        a = sharding.constrain(_residual(a, o, am[2]), AUDIO)

        # 2. text cross-attention
        x = self._text(x, vm, self.norm2, self.attn2, self.prompt_scale_shift_table, c.prompt,
                       c.text, c.text_mask, self.video_text_mod, calls.video_text, sharding,
                       "act_seq")
        x = sharding.constrain(x, VIDEO)
        a = self._text(a, am, self.audio_norm2, self.audio_attn2,
                       self.audio_prompt_scale_shift_table, c.prompt_audio, c.audio_text,
                       c.audio_text_mask, self.audio_text_mod, calls.audio_cross, sharding, None)
        a = sharding.constrain(a, AUDIO)

        # 3. audio -> video and video -> audio
        if not c.isolate:
            x, a = self._av(x, a, c, calls, sharding)

        # 4. feed-forward
        h = modulate(self.norm3(x), vm[3], vm[4]).astype(x.dtype)
        x = sharding.constrain(_residual(x, self.ff(h, sharding, "act_seq"), vm[5]), VIDEO)
        h = modulate(self.audio_norm3(a), am[3], am[4]).astype(a.dtype)
        a = sharding.constrain(_residual(a, self.audio_ff(h, sharding, None), am[5]), AUDIO)
        return x, a

    def _text(self, x, m, norm, attn, prompt_table, prompt, text, mask, q_mod: bool,
              call, sharding, seq):
        """One stream's text cross-attention (step 2)."""
        h = norm(x)
        if q_mod:                          # shift / scale / gate of the query side: terms 6..8
            h = modulate(h, m[6], m[7])
        if prompt_table is not None:       # the text keys / values' modulation
            if prompt is None:
                shift, scale = (r[None, None].astype(jnp.float32) for r in prompt_table[...])
            else:
                shift, scale = mod_terms(prompt_table[...], prompt)
            text = modulate(text.astype(jnp.float32), shift, scale).astype(text.dtype)
        o = attn(h.astype(x.dtype), text, call, sharding, kv_mask=mask, seq=(seq, None))
        return _residual(x, o, m[8] if q_mod else None)

    def _av(self, x, a, c: BlockContext, calls: Calls, sharding):
        """Audio→video and video→audio cross-attention (step 3), both from the norms of the
        tokens as they enter it."""
        nx, na = self.audio_to_video_norm(x), self.video_to_audio_norm(a)
        vt = self.video_a2v_cross_attn_scale_shift_table[...]
        at = self.audio_a2v_cross_attn_scale_shift_table[...]
        v_a2v_scale, v_a2v_shift, v_v2a_scale, v_v2a_shift = mod_terms(vt[:4], c.ca_video)
        a_a2v_scale, a_a2v_shift, a_v2a_scale, a_v2a_shift = mod_terms(at[:4], c.ca_audio)
        (a2v_gate,) = mod_terms(vt[4:], c.gate_video)
        (v2a_gate,) = mod_terms(at[4:], c.gate_audio)
        split = self.split_rope

        q = modulate(nx, v_a2v_shift, v_a2v_scale).astype(x.dtype)
        kv = modulate(na, a_a2v_shift, a_a2v_scale).astype(a.dtype)
        o = self.audio_to_video_attn(q, kv, calls.audio_cross, sharding, q_rope=c.cross_rope,
                                     k_rope=c.audio_cross_rope, split_rope=split,
                                     seq=("act_seq", None))
        x_new = sharding.constrain(_residual(x, o, a2v_gate), VIDEO)

        q = modulate(na, a_v2a_shift, a_v2a_scale).astype(a.dtype)
        kv = modulate(nx, v_v2a_shift, v_v2a_scale).astype(x.dtype)
        o = self.video_to_audio_attn(q, kv, calls.audio_cross, sharding,
                                     q_rope=c.audio_cross_rope, k_rope=c.cross_rope,
                                     kv_mask=c.token_mask, split_rope=split,
                                     seq=(None, "act_seq"))
        a_new = sharding.constrain(_residual(a, o, v2a_gate), AUDIO)
        return x_new, a_new


__all__ = ["Block", "BlockContext", "Calls", "FeedForward", "Norm", "VIDEO", "AUDIO"]
