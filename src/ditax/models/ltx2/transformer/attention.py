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

HEADS = ("act_batch", None, "act_heads", None)


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
