"""What FLUX.1's and FLUX.2's blocks share (:mod:`ditax.models.flux.blocks`,
:mod:`ditax.models.flux2.blocks`): the activation names, the float32 modulation and gated
residual, the joint attention with RoPE, and the second half of a double-stream block
(:class:`DoubleStreams`: the joint attention's outputs projected, each stream's gated
residuals and MLP), which is the same computation in both families once each stream's
q / k / v and modulation terms are made.

Tokens are ``[B, S, D]``; attention I/O ``[B, S, N, K]``; the joint sequence is laid out by
:class:`~ditax.models.common.joint_layout.JointLayout`. Remat names
(:data:`ditax.nn.stack.REMAT`): ``attn_out`` (the attention output), ``proj_out`` (the output
projections and MLPs).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from ditax.attention import AttentionCall
from ditax.models.common.joint_layout import JointLayout
from ditax.nn import apply_rope
from ditax.parallel.sharding import ShardingContext

TOKENS = ("act_batch", "act_seq", "act_embed")
HEADS = ("act_batch", "act_seq", "act_heads", None)
HEAD_MAJOR = ("act_batch", "act_heads", "act_seq", None)
MLP = ("act_batch", "act_seq", "act_mlp")


def modulate(norm, x, shift, scale):
    """``norm(x) · (1 + scale) + shift`` in float32 (a float32 LayerNorm), in ``x``'s dtype."""
    return (norm(x) * (1 + scale) + shift).astype(x.dtype)


def gated(x, gate, h, clip: bool = False):
    """``x + gate · h`` in float32, in ``x``'s dtype (the blocks' residual updates);
    ``clip``: in float16, clipped to its finite range as diffusers clips the single blocks'
    output and the double blocks' text stream."""
    y = x.astype(jnp.float32) + gate * h.astype(jnp.float32)
    if clip and x.dtype == jnp.float16:
        y = jnp.clip(y, -65504.0, 65504.0)
    return y.astype(x.dtype)


def named(x, name: str | None):
    """``x`` named ``name`` for remat (None: unnamed)."""
    return x if name is None else checkpoint_name(x, name)


def attend_joint(q, k, v, rope, kv_mask, attn: AttentionCall, sharding: ShardingContext,
                 head_major: bool = False):
    """RoPE on q and k (float32 inside, :func:`~ditax.nn.apply_rope`), then ``attn`` over the
    joint sequence ``[B, S', N, K]`` (``head_major``: ``[B, N, S', K]`` in and out, the
    layout a TPU kernel reads in place); the output is named ``attn_out`` for remat."""
    lay = HEAD_MAJOR if head_major else HEADS
    q = sharding.constrain(apply_rope(q, *rope, head_major=head_major), lay)
    k = sharding.constrain(apply_rope(k, *rope, head_major=head_major), lay)
    o = sharding.constrain(attn(q, k, v, kv_mask=kv_mask, head_major=head_major), lay)
    return checkpoint_name(o, "attn_out")


class DoubleStreams:
    """The second half of a double-stream block (a mixin of both families' ``DoubleBlock``,
    which owns ``attn.to_out`` / ``attn.to_add_out``, ``norm2`` / ``norm2_context`` (float32
    non-affine LayerNorms) and ``ff`` / ``ff_context``)."""

    def joint_update(self, streams, qkv_img, qkv_txt, terms_img, terms_txt, rope, kv_mask,
                     layout: JointLayout, attn: AttentionCall, sharding: ShardingContext,
                     head_major: bool = False):
        """``streams`` (image ``[B, L', D]``, text ``[B, T', D]``) after the block, from each
        stream's normed q, k, v ``[B, ·, N, K]`` (``head_major``: ``[B, N, ·, K]``, joined,
        attended and projected in that layout) and its six modulation terms (shift, scale,
        gate of the attention, then of the MLP; the first two already applied)."""
        img, txt = streams
        _, _, gate, m_shift, m_scale, m_gate = terms_img
        _, _, c_gate, cm_shift, cm_scale, cm_gate = terms_txt
        seq = 2 if head_major else 1
        q, k, v = (layout.join(a, b, seq) for a, b in zip(qkv_img, qkv_txt))
        o_i, o_t = layout.split(attend_joint(q, k, v, rope, kv_mask, attn, sharding,
                                             head_major), seq)
        heads = "from_head_major" if head_major else "from_heads"   # each Linear's own

        out_i = checkpoint_name(getattr(self.attn.to_out, heads)(o_i), "proj_out")
        img = sharding.constrain(gated(img, gate, out_i), TOKENS)
        h = modulate(self.norm2, img, m_shift, m_scale)
        img = sharding.constrain(gated(img, m_gate, self.ff(h, sharding)), TOKENS)

        out_t = checkpoint_name(getattr(self.attn.to_add_out, heads)(o_t), "proj_out")
        txt = sharding.constrain(gated(txt, c_gate, out_t), TOKENS)
        h = modulate(self.norm2_context, txt, cm_shift, cm_scale)
        txt = sharding.constrain(gated(txt, cm_gate, self.ff_context(h, sharding), clip=True),
                                 TOKENS)
        return img, txt


__all__ = ["TOKENS", "HEADS", "HEAD_MAJOR", "MLP", "DoubleStreams", "attend_joint", "gated",
           "modulate", "named"]
