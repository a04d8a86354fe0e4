"""LTX-2's attention layer (diffusers ``LTX2Attention`` with ``LTX2AudioVideoAttnProcessor``):
every attention of a block — self, text cross and audio↔video cross — is one of these.

``x [B, S, Dq]`` attends to ``context [B, Sk, Dk]`` (itself for self-attention):
``q / k / v = to_q(x) / to_k(context) / to_v(context)`` (``N`` heads of ``K``), q and k RMS
normed across all heads (``[N·K]`` gains), rotated by their own RoPE tables (q's and k's
differ in the audio↔video attentions), attention through the site's
:class:`~ditax.attention.AttentionCall`, optionally gated per head by ``2·sigmoid(
to_gate_logits(x))`` (``gated_attn``), then ``to_out``. Under spatio-temporal guidance
(diffusers ``LTX2PerturbedAttnProcessor``) a self-attention's output is blended back towards
its values, ``lerp(v, o, m)`` per sample (``m = 0``: the values alone), before the gates.

A call whose kernel reads head-major (:attr:`~ditax.attention.AttentionCall.reads_head_major`:
splash, flash, the sequence backends around them) gets q / k / v ``[B, N, L, K]`` written so
by the projections' dots (:meth:`~ditax.nn.Linear.to_head_major`), normed and rotated in that
layout, and ``to_out`` contracts ``(N, K)`` where the kernel wrote them: on TPU the view
``[L, N·K] → [L, N, K]`` is itself a relayout, which XLA did as two transposes of each input
(at 768x512x121 on v6e-8, data 2 x context 4: 11.25 → 3.71 GiB of relayout copies a chip; what
is left is the kernels' shards relaid out for those dots, ``docs/ltx2_peer_v6e8.jsonl``). The
same values: the norm's mean runs over the same ``N·K`` channels in float32, RoPE is the same
products (the tables transposed, out of the layer loop). Where a RoPE's groups are not the
heads, token-major.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from ditax.attention import AttentionCall
from ditax.attention.registry import get as backend_entry
from ditax.models.ltx2.config import QK_EPS
from ditax.models.ltx2.transformer.rope import Rope, apply_rope
from ditax.nn import Linear, RMSNorm
from ditax.parallel.sharding import ShardingContext

HEADS = ("act_batch", None, "act_heads", None)        # [B, L, N, K]
HEAD_MAJOR = ("act_batch", "act_heads")                # [B, N, L, K]: + (L axis, None)


class Attention(nnx.Module):
    """One LTX-2 attention: ``heads x head_dim`` wide, queries from ``query_dim``, keys and
    values from ``kv_dim`` (see the module docstring)."""

    def __init__(self, query_dim: int, kv_dim: int, heads: int, head_dim: int, *,
                 bias: bool, out_bias: bool, gated: bool, dtype, param_dtype, rngs):
        inner = heads * head_dim
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.to_q = Linear(query_dim, inner, bias=bias, **kw)
        self.to_k = Linear(kv_dim, inner, bias=bias, **kw)
        self.to_v = Linear(kv_dim, inner, bias=bias, **kw)
        self.norm_q = RMSNorm(inner, QK_EPS, param_dtype=param_dtype)
        self.norm_k = RMSNorm(inner, QK_EPS, param_dtype=param_dtype)
        self.to_out = Linear(inner, query_dim, bias=out_bias, **kw)       # diffusers: to_out.0
        self.to_gate_logits = Linear(query_dim, heads, **kw) if gated else None
        self.heads = heads

    def __call__(self, x, context, call: AttentionCall, sharding: ShardingContext, *,
                 q_rope: Rope | None = None, k_rope: Rope | None = None, kv_mask=None,
                 split_rope: bool = False, seq=("act_seq", "act_seq"), perturb=None):
        """``x [B, S, Dq]``, ``context [B, Sk, Dk]`` → ``[B, S, Dq]``; ``k_rope`` None: q's
        table (self-attention); ``kv_mask [B, Sk]`` (True = key); ``seq``: the logical axis
        of q's and of k's tokens (``"act_seq"`` for video tokens, None for audio and text);
        ``perturb [B]`` float32: the STG blend weight of each sample (None: none)."""
        if call.reads_head_major and self._head_major_fits(q_rope, k_rope):
            return self._head_major(x, context, call, sharding, q_rope, k_rope, kv_mask,
                                    split_rope, seq, perturb)
        b, s = x.shape[:2]
        sq, sk = seq
        q = self.norm_q(self.to_q(x))
        k = self.norm_k(self.to_k(context))
        v = self.to_v(context)
        q, k, v = (a.reshape(a.shape[:2] + (self.heads, -1)) for a in (q, k, v))
        if q_rope is not None:
            q = apply_rope(q, q_rope, split_rope)
            k = apply_rope(k, q_rope if k_rope is None else k_rope, split_rope)
        q = sharding.constrain(q, HEADS[:1] + (sq,) + HEADS[2:])
        k, v = (sharding.constrain(a, HEADS[:1] + (sk,) + HEADS[2:]) for a in (k, v))
        o = checkpoint_name(call(q, k, v, kv_mask=kv_mask), "attn_out")
        o = sharding.constrain(o, HEADS[:1] + (sq,) + HEADS[2:])
        if perturb is not None:
            o = lerp(v, o, perturb.reshape(-1, 1, 1, 1))
        if self.to_gate_logits is not None:
            gates = 2.0 * jax.nn.sigmoid(self.to_gate_logits(x).astype(jnp.float32))
            o = (o.astype(jnp.float32) * gates[..., None]).astype(o.dtype)
        return checkpoint_name(self.to_out.from_heads(o), "proj_out")


    def _head_major_fits(self, q_rope, k_rope) -> bool:
        """Whether RoPE can rotate head-major q / k in place: its groups are the heads."""
        return all(r is None or r.cos.shape[2] == self.heads for r in (q_rope, k_rope))

    def _head_major(self, x, context, call, sharding, q_rope, k_rope, kv_mask, split_rope,
                    seq, perturb):
        """The layer with q / k / v head-major ``[B, N, L, K]`` from the projections' dots
        (the TPU kernels' layout; a ``[L, N·K] → [L, N, K]`` view is a relayout there), the
        across-heads RMS norms and RoPE in that layout, ``to_out`` contracting ``(N, K)``."""
        n, (sq, sk) = self.heads, seq
        q = _norm_heads(self.norm_q, self.to_q.to_head_major(x, n))
        k = _norm_heads(self.norm_k, self.to_k.to_head_major(context, n))
        v = self.to_v.to_head_major(context, n)
        if q_rope is not None:
            q = apply_rope(q, q_rope, split_rope, head_major=True)
            k = apply_rope(k, q_rope if k_rope is None else k_rope, split_rope,
                           head_major=True)
        q = sharding.constrain(q, HEAD_MAJOR + (sq, None))
        k, v = (sharding.constrain(a, HEAD_MAJOR + (sk, None)) for a in (k, v))
        o = checkpoint_name(call(q, k, v, kv_mask=kv_mask, head_major=True), "attn_out")
        o = sharding.constrain(o, HEAD_MAJOR + (sq, None))
        if perturb is not None:
            o = lerp(v, o, perturb.reshape(-1, 1, 1, 1))
        if self.to_gate_logits is not None:
            gates = 2.0 * jax.nn.sigmoid(self.to_gate_logits(x).astype(jnp.float32))
            o = (o.astype(jnp.float32) * jnp.swapaxes(gates, 1, 2)[..., None]).astype(o.dtype)
        return checkpoint_name(self.to_out.from_head_major(o), "proj_out")


def _norm_heads(norm: RMSNorm, x):
    """``norm`` (RMS over all ``N·K`` channels of a token) on head-major ``x [B, N, L, K]``."""
    n, k = x.shape[1], x.shape[3]
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=(1, 3), keepdims=True) + norm.eps)
    return (y * norm.scale[...].astype(jnp.float32).reshape(n, 1, k)).astype(x.dtype)


def lerp(start, end, weight):
    """``torch.lerp(start, end, weight)`` in float32, in ``end``'s dtype: ``start + w·(end −
    start)`` below one half, ``end − (end − start)·(1 − w)`` from it (so ``w = 0`` / ``1``
    give ``start`` / ``end`` exactly)."""
    s, e = start.astype(jnp.float32), end.astype(jnp.float32)
    w = jnp.asarray(weight, jnp.float32)
    return jnp.where(w < 0.5, s + w * (e - s), e - (e - s) * (1 - w)).astype(end.dtype)


def local_call(call: AttentionCall) -> AttentionCall:
    """``call`` itself for a local kernel; a sequence backend's local kernel (with the options
    it passes on) as its own call — the audio self-attention's under ulysses / ring."""
    if call.entry.kind == "local":
        return call
    name, opts = call.local()
    return AttentionCall(name, backend_entry(name).resolve(opts, call.platform), call.sharding,
                         call.platform)


__all__ = ["Attention", "lerp", "local_call"]
