"""Flux's blocks in Flax NNX (diffusers ``FluxTransformerBlock`` / ``FluxSingleTransformerBlock``).

- :class:`DoubleBlock` (double stream): text and image tokens each get their own adaLN-Zero
  modulation, q/k/v projections (image: ``to_q/k/v``; text: the added ``add_q/k/v_proj``),
  q/k RMS norms, output projection and MLP; the attention in between is one joint attention
  over image and text tokens.
- :class:`SingleBlock` (single stream): one modulation of the joint sequence feeds attention
  and the MLP in parallel; one ``proj_out`` reads both.

Tokens are ``[B, S, D]``; attention I/O ``[B, S, N, K]``. The joint sequence is laid out by
:class:`~ditax.models.common.joint_layout.JointLayout` (shard-major over the context shards); blocks
only see it through ``layout.join`` / ``layout.split``. Norms, modulation and the gated
residuals run in float32 and are cast back to the compute dtype (as Wan's blocks do).

Remat names (:data:`ditax.nn.stack.REMAT`): ``attn_out`` (the attention output, both kinds),
``proj_out`` (every output projection: ``to_out``, ``to_add_out``, the MLPs' ``net.2``, the
single blocks' ``proj_out``) and ``proj_in`` (the double blocks' q / k / v and MLP input
projections; the single blocks' are left unnamed, so ``model.remat=save_proj`` recomputes
them and stays within memory at FLUX.1-dev's 1024² training; the presets'
``save_proj_out`` recomputes the double blocks' too, for 8 GiB less a chip there).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from ditax.attention import AttentionCall
from ditax.models.common.bfl.blocks import (HEADS, MLP, TOKENS, DoubleStreams, attend_joint,
                                            gated, modulate, named)
from ditax.models.common.joint_layout import JointLayout
from ditax.models.flux.config import EPS, FluxConfig
from ditax.nn import FP32LayerNorm, Linear, RMSNorm
from ditax.parallel.sharding import ShardingContext


class AdaNorm(nnx.Module):
    """The modulation of diffusers' ``AdaLayerNormZero`` (n=6), ``…ZeroSingle`` (n=3) and
    ``AdaLayerNormContinuous`` (n=2): ``linear(SiLU(temb))`` split into ``n`` float32 terms
    ``[B, 1, D]``, and the non-affine LayerNorm (eps 1e-6) they modulate."""

    def __init__(self, dim: int, n: int, *, dtype, param_dtype, rngs):
        self.linear = Linear(dim, n * dim, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.norm = FP32LayerNorm(dim, EPS, affine=False, param_dtype=param_dtype)
        self.n = n

    def terms(self, temb) -> list:
        mod = self.linear(jax.nn.silu(temb)).astype(jnp.float32)
        return [m[:, None, :] for m in jnp.split(mod, self.n, axis=-1)]

    def modulate(self, x, shift, scale):
        """``LayerNorm(x) · (1 + scale) + shift`` in float32, in ``x``'s dtype."""
        return modulate(self.norm, x, shift, scale)


class FeedForward(nnx.Module):
    """``net.0.proj → GELU(tanh) → net.2`` (diffusers ``FeedForward``, gelu-approximate)."""

    def __init__(self, dim, mlp_dim, *, dtype, param_dtype, rngs):
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.proj_in = Linear(dim, mlp_dim, **kw)     # diffusers: net.0.proj
        self.proj_out = Linear(mlp_dim, dim, **kw)    # diffusers: net.2

    def __call__(self, x, sharding: ShardingContext):
        """``x [B, S, D]`` → ``[B, S, D]``; the two projections' outputs are named
        ``proj_in`` / ``proj_out`` for remat (the double blocks' only user)."""
        h = checkpoint_name(self.proj_in(x), "proj_in")
        h = sharding.constrain(jax.nn.gelu(h, approximate=True), MLP)
        return checkpoint_name(self.proj_out(h), "proj_out")


class Attention(nnx.Module):
    """diffusers ``FluxAttention``: ``to_q/k/v`` with per-head RMS norms ``norm_q/k``;
    ``added`` (double blocks) adds the text projections ``add_q/k/v_proj``, ``norm_added_q/k``
    and ``to_add_out``; ``out`` (double blocks) the image output ``to_out`` (diffusers
    ``to_out.0``). Single blocks have neither: their ``proj_out`` reads the heads."""

    def __init__(self, cfg: FluxConfig, *, added: bool, out: bool, rngs):
        d, k = cfg.inner_dim, cfg.attention_head_dim
        kw = dict(dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs)
        self.heads = cfg.num_attention_heads
        self.to_q, self.to_k, self.to_v = (Linear(d, d, **kw) for _ in range(3))
        self.norm_q = RMSNorm(k, EPS, param_dtype=cfg.param_dtype)
        self.norm_k = RMSNorm(k, EPS, param_dtype=cfg.param_dtype)
        self.to_out = Linear(d, d, **kw) if out else None
        if added:
            self.add_q_proj, self.add_k_proj, self.add_v_proj = (Linear(d, d, **kw)
                                                                 for _ in range(3))
            self.norm_added_q = RMSNorm(k, EPS, param_dtype=cfg.param_dtype)
            self.norm_added_k = RMSNorm(k, EPS, param_dtype=cfg.param_dtype)
            self.to_add_out = Linear(d, d, **kw)

    def _heads(self, x):
        return x.reshape(x.shape[:2] + (self.heads, -1))

    def qkv(self, x, sharding: ShardingContext, name: str | None = None):
        """``x [B, S, D]`` → normed q, k and v ``[B, S, N, K]``; ``name``: the remat name of
        the three projections' outputs (None: unnamed)."""
        q, k, v = (named(self._heads(p(x)), name) for p in (self.to_q, self.to_k, self.to_v))
        q, k = self.norm_q(q), self.norm_k(k)
        return tuple(sharding.constrain(a, HEADS) for a in (q, k, v))

    def added_qkv(self, x, sharding: ShardingContext, name: str | None = None):
        """Text tokens ``[B, T', D]`` → their normed q, k and v (double blocks)."""
        q, k, v = (named(self._heads(p(x)), name)
                   for p in (self.add_q_proj, self.add_k_proj, self.add_v_proj))
        q, k = self.norm_added_q(q), self.norm_added_k(k)
        return tuple(sharding.constrain(a, HEADS) for a in (q, k, v))


class DoubleBlock(DoubleStreams, nnx.Module):
    """One double-stream block on ``(image [B, L', D], text [B, T', D])``."""

    def __init__(self, cfg: FluxConfig, *, rngs):
        d = cfg.inner_dim
        kw = dict(dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs)
        self.norm1 = AdaNorm(d, 6, **kw)
        self.norm1_context = AdaNorm(d, 6, **kw)
        self.attn = Attention(cfg, added=True, out=True, rngs=rngs)
        self.norm2 = FP32LayerNorm(d, EPS, affine=False, param_dtype=cfg.param_dtype)
        self.ff = FeedForward(d, cfg.mlp_dim, **kw)
        self.norm2_context = FP32LayerNorm(d, EPS, affine=False, param_dtype=cfg.param_dtype)
        self.ff_context = FeedForward(d, cfg.mlp_dim, **kw)

    def __call__(self, streams, temb, rope, kv_mask, layout: JointLayout, attn: AttentionCall,
                 sharding: ShardingContext):
        """``streams`` (image, text) → the same after the block; ``temb [B, D]``; rope (cos,
        sin) ``[S', K]`` and ``kv_mask [B, S']`` (or None) of the joint layout."""
        img, txt = streams
        terms, terms_txt = self.norm1.terms(temb), self.norm1_context.terms(temb)
        qkv_img = self.attn.qkv(self.norm1.modulate(img, *terms[:2]), sharding, "proj_in")
        qkv_txt = self.attn.added_qkv(self.norm1_context.modulate(txt, *terms_txt[:2]),
                                      sharding, "proj_in")
        return self.joint_update(streams, qkv_img, qkv_txt, terms, terms_txt, rope, kv_mask,
                                 layout, attn, sharding)


class SingleBlock(nnx.Module):
    """One single-stream block on the joint tokens ``[B, S', D]``: attention and MLP of one
    modulated input in parallel, ``proj_out`` over both (diffusers concatenates the attention
    output and the MLP activations, ``[D + M]``; here the kernel's two row blocks contract
    each part, so with heads and MLP columns split over ``tensor`` neither is gathered)."""

    def __init__(self, cfg: FluxConfig, *, rngs):
        d = cfg.inner_dim
        kw = dict(dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs)
        self.norm = AdaNorm(d, 3, **kw)
        self.proj_mlp = Linear(d, cfg.mlp_dim, **kw)
        self.proj_out = Linear(d + cfg.mlp_dim, d, **kw)
        self.attn = Attention(cfg, added=False, out=False, rngs=rngs)

    def __call__(self, x, temb, rope, kv_mask, attn: AttentionCall,
                 sharding: ShardingContext):
        shift, scale, gate = self.norm.terms(temb)
        h = self.norm.modulate(x, shift, scale)
        mlp = sharding.constrain(jax.nn.gelu(self.proj_mlp(h), approximate=True), MLP)
        o = attend_joint(*self.attn.qkv(h, sharding), rope, kv_mask, attn, sharding)
        n, k = o.shape[-2:]
        if type(self.proj_out) is Linear and self.proj_out.quant is None:
            dt = self.proj_out.dtype
            w = self.proj_out.kernel[...].astype(dt)
            out = (jnp.einsum("bsnk,nkd->bsd", o.astype(dt), w[:n * k].reshape(n, k, -1))
                   + jnp.einsum("bsm,md->bsd", mlp.astype(dt), w[n * k:])
                   + self.proj_out.bias[...].astype(dt))
        else:   # a LoRA-carrying or 8-bit layer (ditax.lora, ditax.nn.quant): its own call
            #     on the joined input
            out = self.proj_out(self.proj_out.joined_input([o, mlp.astype(o.dtype)], 2))
        out = checkpoint_name(out, "proj_out")
        return sharding.constrain(gated(x, gate, out, clip=True), TOKENS)


__all__ = ["AdaNorm", "FeedForward", "Attention", "DoubleBlock", "SingleBlock"]
