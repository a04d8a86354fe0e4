"""FLUX.2's blocks in Flax NNX (diffusers ``Flux2TransformerBlock`` /
``Flux2SingleTransformerBlock``).

- :class:`DoubleBlock` (double stream): image and text tokens each get their own q / k / v
  projections (image ``to_q/k/v``, text ``add_q/k/v_proj``), per-head RMS norms, output
  projection and SwiGLU MLP; the attention in between is one joint attention over both.
- :class:`SingleBlock` (single stream, a "parallel" block): one fused input projection
  ``to_qkv_mlp_proj [D → 3D + 2M]`` feeds attention and the SwiGLU MLP; one fused output
  projection ``to_out [D + M → D]`` reads both.

Unlike FLUX.1 the blocks own no modulation: the shift / scale / gate terms come from three
model-level projections of the time embedding (:class:`~ditax.models.flux2.embeddings.
Modulation`), computed once and handed to every block (``mod [B, 6D]`` per stream of a double
block, ``[B, 3D]`` for a single block). The norms are non-affine LayerNorms. No linear has a
bias.

Tokens are ``[B, S, D]``; attention I/O ``[B, S, N, K]``, or head-major ``[B, N, S, K]`` in
the double blocks under a kernel that reads it (splash, flash: ``AttentionCall.
reads_head_major``): their q / k / v kernels are stored head-major ``[N, D, K]``
(``Linear(out_heads=N)``), so the dots write that layout from the kernels as they lie (stored
``[D, N·K]``, XLA transposed the six kernels in every layer on a v5e: ~0.16 ms each at
klein-4B) and ``to_out`` / ``to_add_out`` contract the kernel's output in place. The single
blocks stay token-major (their fused ``[D, 3D + 2M]`` kernel would be sliced and relaid out
for a head-major dot in every layer of the scanned stack, which cost more than the q / k
relayouts it saves; docs/tpu_v5e.md). The joint sequence is laid out by
:class:`~ditax.models.common.joint_layout.JointLayout` (shard-major over the context shards, image
first; attention does not depend on token order). Norms, modulation and the gated residuals
run in float32 and are cast back to the compute dtype.

Remat names (:data:`ditax.nn.stack.REMAT`): ``attn_out`` (attention output, both kinds),
``proj_out`` (every output projection) and ``proj_in`` (the double blocks' q / k / v and MLP
input projections; the single blocks' fused input is left unnamed, as FLUX.1's, so
``model.remat=save_proj`` recomputes it).

The fused projections' columns (``[q | k | v | gate | value]``) and the SwiGLU input's
(``[gate | value]``) are stored whole, as diffusers stores them, so they are not split over
``tensor`` (their outputs are, by the activation constraints).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from ditax.attention import AttentionCall
from ditax.models.common.bfl.blocks import (HEAD_MAJOR, HEADS, MLP, TOKENS, DoubleStreams,
                                            attend_joint, gated, modulate, named)
from ditax.models.common.joint_layout import JointLayout
from ditax.models.flux2.config import Flux2Config
from ditax.models.flux2.embeddings import mod_terms
from ditax.nn import FP32LayerNorm, Linear, RMSNorm
from ditax.parallel.sharding import ShardingContext


def swiglu(h):
    """``SiLU(gate) · value`` of ``h [..., 2M] = [gate | value]`` (diffusers ``Flux2SwiGLU``)."""
    gate, value = jnp.split(h, 2, axis=-1)
    return jax.nn.silu(gate) * value


class FeedForward(nnx.Module):
    """``linear_in [D → 2M] → SwiGLU → linear_out [M → D]`` (diffusers
    ``Flux2FeedForward``)."""

    def __init__(self, dim, mlp_dim, *, dtype, param_dtype, rngs):
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs, bias=False)
        self.linear_in = Linear(dim, 2 * mlp_dim, **kw)
        self.linear_out = Linear(mlp_dim, dim, **kw)

    def __call__(self, x, sharding: ShardingContext):
        h = checkpoint_name(self.linear_in(x), "proj_in")
        h = sharding.constrain(swiglu(h), MLP)
        return checkpoint_name(self.linear_out(h), "proj_out")


class Attention(nnx.Module):
    """diffusers ``Flux2Attention`` of a double block: image ``to_q/k/v`` + ``norm_q/k`` +
    ``to_out`` (diffusers ``to_out.0``), text ``add_q/k/v_proj`` + ``norm_added_q/k`` +
    ``to_add_out``."""

    def __init__(self, cfg: Flux2Config, *, rngs):
        d, k = cfg.inner_dim, cfg.attention_head_dim
        kw = dict(dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs, bias=False)
        norm = lambda: RMSNorm(k, cfg.eps, param_dtype=cfg.param_dtype)  # noqa: E731
        self.heads = n = cfg.num_attention_heads
        hm = dict(kw, out_heads=n)                 # q / k / v kernels stored [N, D, K]
        self.to_q, self.to_k, self.to_v = (Linear(d, d, **hm) for _ in range(3))
        self.norm_q, self.norm_k = norm(), norm()
        self.to_out = Linear(d, d, **kw)
        self.add_q_proj, self.add_k_proj, self.add_v_proj = (Linear(d, d, **hm)
                                                             for _ in range(3))
        self.norm_added_q, self.norm_added_k = norm(), norm()
        self.to_add_out = Linear(d, d, **kw)

    def _heads(self, x):
        return x.reshape(x.shape[:2] + (self.heads, -1))

    def qkv(self, x, sharding: ShardingContext, added: bool, head_major: bool = False):
        """Tokens ``[B, S, D]`` → normed q, k and v ``[B, S, N, K]`` (``head_major``:
        ``[B, N, S, K]``, written so by the dots; ``added``: the text projections); the
        projections' outputs are named ``proj_in``."""
        projs = ((self.add_q_proj, self.add_k_proj, self.add_v_proj) if added
                 else (self.to_q, self.to_k, self.to_v))
        norms = (self.norm_added_q, self.norm_added_k) if added else (self.norm_q, self.norm_k)
        if head_major:
            q, k, v = (named(p.to_head_major(x, self.heads), "proj_in") for p in projs)
        else:
            q, k, v = (named(self._heads(p(x)), "proj_in") for p in projs)
        q, k = norms[0](q), norms[1](k)
        return tuple(sharding.constrain(a, HEAD_MAJOR if head_major else HEADS)
                     for a in (q, k, v))


class DoubleBlock(DoubleStreams, nnx.Module):
    """One double-stream block on ``(image [B, L', D], text [B, T', D])``."""

    def __init__(self, cfg: Flux2Config, *, rngs):
        d = cfg.inner_dim
        kw = dict(dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs)
        norm = lambda: FP32LayerNorm(d, cfg.eps, affine=False,  # noqa: E731
                                     param_dtype=cfg.param_dtype)
        self.norm1, self.norm1_context = norm(), norm()
        self.attn = Attention(cfg, rngs=rngs)
        self.norm2, self.norm2_context = norm(), norm()
        self.ff = FeedForward(d, cfg.mlp_dim, **kw)
        self.ff_context = FeedForward(d, cfg.mlp_dim, **kw)

    def __call__(self, streams, mod_img, mod_txt, rope, kv_mask, layout: JointLayout,
                 attn: AttentionCall, sharding: ShardingContext):
        """``streams`` (image, text) → the same after the block; ``mod_img`` / ``mod_txt``
        ``[B, 6D]`` float32 (the shared modulations); rope (cos, sin) ``[S', K]`` and
        ``kv_mask [B, S']`` (or None) of the joint layout."""
        img, txt = streams
        hm = attn.reads_head_major
        terms, terms_txt = mod_terms(mod_img, 6), mod_terms(mod_txt, 6)
        qkv_img = self.attn.qkv(modulate(self.norm1, img, *terms[:2]), sharding, False, hm)
        qkv_txt = self.attn.qkv(modulate(self.norm1_context, txt, *terms_txt[:2]), sharding,
                                True, hm)
        return self.joint_update(streams, qkv_img, qkv_txt, terms, terms_txt, rope, kv_mask,
                                 layout, attn, sharding, head_major=hm)


class ParallelAttention(nnx.Module):
    """diffusers ``Flux2ParallelSelfAttention``: ``to_qkv_mlp_proj [D → 3D + 2M]`` (q, k, v,
    then the SwiGLU gate and value), ``norm_q/k``, ``to_out [D + M → D]`` (attention heads,
    then the MLP)."""

    def __init__(self, cfg: Flux2Config, *, rngs):
        d, m, k = cfg.inner_dim, cfg.mlp_dim, cfg.attention_head_dim
        kw = dict(dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs, bias=False)
        self.heads = cfg.num_attention_heads
        self.to_qkv_mlp_proj = Linear(d, 3 * d + 2 * m, **kw)
        self.norm_q = RMSNorm(k, cfg.eps, param_dtype=cfg.param_dtype)
        self.norm_k = RMSNorm(k, cfg.eps, param_dtype=cfg.param_dtype)
        self.to_out = Linear(d + m, d, **kw)


class SingleBlock(nnx.Module):
    """One single-stream block on the joint tokens ``[B, S', D]``: attention and SwiGLU MLP of
    one modulated input in parallel, ``attn.to_out`` over both."""

    def __init__(self, cfg: Flux2Config, *, rngs):
        self.norm = FP32LayerNorm(cfg.inner_dim, cfg.eps, affine=False,
                                  param_dtype=cfg.param_dtype)
        self.attn = ParallelAttention(cfg, rngs=rngs)

    def __call__(self, x, mod, rope, kv_mask, attn: AttentionCall, sharding: ShardingContext):
        """``x [B, S', D]``, ``mod [B, 3D]`` float32 → ``[B, S', D]``."""
        shift, scale, gate = mod_terms(mod, 3)
        a = self.attn
        d = x.shape[-1]
        proj = a.to_qkv_mlp_proj(modulate(self.norm, x, shift, scale))
        q, k, v = (proj[..., i * d:(i + 1) * d].reshape(x.shape[:2] + (a.heads, -1))
                   for i in range(3))
        q, k = a.norm_q(q), a.norm_k(k)
        q, k, v = (sharding.constrain(t, HEADS) for t in (q, k, v))
        mlp = sharding.constrain(swiglu(proj[..., 3 * d:]), MLP)
        o = attend_joint(q, k, v, rope, kv_mask, attn, sharding)
        # [B, S', N, K] and [B, S', M] joined as to_out reads them (8-bit activations: each
        # quantized in its own shape, one scale per token)
        out = checkpoint_name(a.to_out(a.to_out.joined_input([o, mlp.astype(o.dtype)], 2)),
                              "proj_out")
        return sharding.constrain(gated(x, gate, out, clip=True), TOKENS)


__all__ = ["Attention", "DoubleBlock", "FeedForward", "ParallelAttention", "SingleBlock",
           "swiglu"]
