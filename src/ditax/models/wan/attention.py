"""Wan's attention layer (diffusers ``WanAttention`` + ``WanAttnProcessor``): q/k/v
projections, RMSNorm across heads on q and k, RoPE, attend, ``to_out``.

Two layouts, chosen once from the attention plan
(:attr:`~ditax.attention.AttentionCall.reads_head_major`, static: part of the compiled
program's identity):

- token-major ``[B, L, N, K]``, the ``attend`` convention (xla, blockwise, cuDNN, TE, and
  the sequence backends around them);
- head-major ``[B, N, L, K]`` for the TPU kernels (splash, flash, and the Ulysses / ring
  paths around them): the projections write it straight from their dots
  (:meth:`~ditax.nn.Linear.to_head_major`; their kernels are stored head-major ``[N, D, K]``,
  ``Linear(out_heads=N)``, so neither the activations nor the weight shards are relaid out
  for that dot), the RMSNorm across heads and RoPE run in it
  (one reduction over ``(N, K)``, one elementwise pass with the RoPE partner product, no
  reshape between), the kernels and the Ulysses exchange read it in place, and ``to_out``
  contracts ``(N, K)`` of the kernel's output where it lies
  (:meth:`~ditax.nn.Linear.from_head_major`). On TPU a ``[L, D] → [L, N, K]`` view is itself
  a relayout ((8, 128) tiles cover the two minor dims); this way there is none (measured at
  Wan 14B 720p on v6e: ``docs/architecture.md``, "TPU relayout copies").

Both compute the same values: the norm's mean runs over the same ``N·K`` channels in float32
(summation order may differ, well inside float32 parity), RoPE is the same product.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from ditax.attention import AttentionCall
from ditax.errors import ConfigError
from ditax.models.wan.config import WanConfig
from ditax.nn import Linear, RMSNorm, apply_rope
from ditax.nn import head_projection
from ditax.nn.head_projection import (HeadProjection, pre_norm, project_many,
                                      rms_across_heads, why_not)
from ditax.parallel.platform import platform_of
from ditax.parallel.sharding import ShardingContext

TOKENS = ("act_batch", "act_seq", "act_heads", None)       # [B, L, N, K]
HEADS = ("act_batch", "act_heads", "act_seq", None)        # [B, N, L, K]


def rms_norm_heads(norm: RMSNorm, x):
    """Wan's ``rms_norm_across_heads`` on head-major ``x [B, N, L, K]``: RMS over all ``N·K``
    channels of a token (float32 inside, ``x.dtype`` out), scaled by ``norm``'s ``[N·K]``
    weight viewed ``[N, 1, K]`` (:func:`~ditax.nn.head_projection.rms_across_heads`, the
    fused projections' reference)."""
    return rms_across_heads(x, norm.scale[...], norm.eps)


def fused_projections(mode: str, attn, sharding: ShardingContext, x, lin: Linear):
    """Whether this call's projections run as Pallas kernels (:mod:`ditax.nn.head_projection`,
    ``model.projections``: given the block's norm, self-attention's q, k and v in one kernel
    and the cross-attention's query in another; else q and k one each): None for XLA's, else
    the kernel's ``interpret`` flag. ``auto``: on one TPU chip, bfloat16, a plain
    full-precision ``Linear`` (no 8-bit weights, no unmerged LoRA), 128-lane heads;
    ``fused``: there, or interpreted off a TPU (tests), else a :class:`ConfigError` naming
    why (a requested kernel never runs as another)."""
    if mode == "xla":
        return None
    call = attn
    while not isinstance(call, AttentionCall) and hasattr(call, "base"):   # causal, cached
        call = call.base
    planned = isinstance(call, AttentionCall)
    mesh = call.mesh if planned else sharding.mesh
    platform = (call.platform if planned else None) or platform_of(mesh)
    w = lin.kernel[...]
    why = (why_not(jax.ShapeDtypeStruct(x.shape, lin.dtype), w, HeadProjection(rope=True))
           if w.ndim == 3 else "the kernel is not stored head-major")
    why = why or (f"the weights are {type(lin).__name__}, not a plain Linear"
                  if type(lin) is not Linear or lin.quant is not None else None)
    why = why or (f"the mesh has {mesh.size} devices" if mesh is not None and mesh.size > 1
                  else None)
    if mode == "auto":
        return False if why is None and platform.name == "tpu" else None
    if why:
        raise ConfigError(f"model.projections=fused cannot run here: {why}; use "
                          f"model.projections=auto or xla")
    return platform.name != "tpu"


class WanAttention(nnx.Module):
    """q/k/v projections, RMSNorm across heads on q and k, optional RoPE, attend, out proj.

    ``gated`` (``attention.sparsity=vsa``, self-attention): ``to_gate_compress``, the
    per-token gate of VSA's coarse branch (:mod:`ditax.attention.sparse.vsa`; zero at init,
    so a dense checkpoint starts with the coarse branch off; missing from a dense checkpoint
    it keeps that init); a gated call (:attr:`VsaCall.gated`) gets it as ``gate=``.

    ``added_kv`` (image-to-video cross-attention): ``add_k_proj`` / ``add_v_proj`` /
    ``norm_added_k`` project the image tokens; the same queries attend to them with no mask
    and that output is added to the text attention's before ``to_out`` (diffusers
    ``WanAttnProcessor``).
    """

    def __init__(self, cfg: WanConfig, *, rngs, added_kv: bool = False, gated: bool = False):
        d = cfg.inner_dim
        kw = dict(dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs)
        self.heads = n = cfg.num_attention_heads
        self.projections = getattr(cfg, "projections", "auto")   # model.projections
        # q / k / v kernels stored head-major [N, D, K] (module docstring)
        self.to_q = Linear(d, d, out_heads=n, **kw)
        self.to_k = Linear(d, d, out_heads=n, **kw)
        self.to_v = Linear(d, d, out_heads=n, **kw)
        self.to_out = Linear(d, d, **kw)              # diffusers: to_out.0
        self.norm_q = RMSNorm(d, cfg.eps, param_dtype=cfg.param_dtype)
        self.norm_k = RMSNorm(d, cfg.eps, param_dtype=cfg.param_dtype)
        if gated:   # attention.sparsity=vsa: g_c, zero at init (ditax.attention.sparse.vsa)
            self.to_gate_compress = Linear(d, d, **kw)
            self.to_gate_compress.kernel[...] = jnp.zeros_like(self.to_gate_compress.kernel[...])
        if added_kv:
            self.add_k_proj = Linear(cfg.added_kv_proj_dim, d, out_heads=n, **kw)
            self.add_v_proj = Linear(cfg.added_kv_proj_dim, d, out_heads=n, **kw)
            self.norm_added_k = RMSNorm(d, cfg.eps, param_dtype=cfg.param_dtype)

    def __call__(self, x, ctx, attn: AttentionCall, sharding: ShardingContext, *, rope=None,
                 kv_mask=None, image=None, pre=None):
        """x ``[B, Lq, D]``, ctx ``[B, Lk, D]`` → ``[B, Lq, D]``; ``image`` ``[B, S, D]`` the
        embedded image tokens (attention layers built with ``added_kv`` only), attended
        with ``attn`` too; ``sharding`` the model's context (constrains q, k, v and the
        output); ``rope`` (cos, sin) ``[Lq, K]`` for self-attention. ``pre`` =
        ``(mul, add, eps)``: the layer's input is
        :func:`~ditax.nn.head_projection.pre_norm` of ``x`` (the block's norm; inside the
        fused projections' kernel where they run), and ``ctx=None`` means that input too
        (self-attention)."""
        if attn.reads_head_major:
            return self._head_major(x, ctx, attn, sharding, rope, kv_mask, image, pre)
        if pre is not None:
            x = pre_norm(x, *pre)
        ctx = x if ctx is None else ctx
        b, lq, _ = x.shape
        lk = ctx.shape[1]
        q = self.norm_q(self.to_q(x)).reshape(b, lq, self.heads, -1)
        k = self.norm_k(self.to_k(ctx)).reshape(b, lk, self.heads, -1)
        v = self.to_v(ctx).reshape(b, lk, self.heads, -1)
        if rope is not None:
            q = apply_rope(q, *rope)
            k = apply_rope(k, *rope)
        q = sharding.constrain(q, TOKENS)
        if rope is not None:
            k = sharding.constrain(k, TOKENS)
            v = sharding.constrain(v, TOKENS)
        if getattr(attn, "gated", False):
            gate = self.to_gate_compress(x).reshape(b, lq, self.heads, -1)
            o = attn(q, k, v, kv_mask=kv_mask, gate=sharding.constrain(gate, TOKENS))
        else:
            o = attn(q, k, v, kv_mask=kv_mask)
        if image is not None:
            li = image.shape[1]
            k_img = self.norm_added_k(self.add_k_proj(image)).reshape(b, li, self.heads, -1)
            v_img = self.add_v_proj(image).reshape(b, li, self.heads, -1)
            o = o + attn(q, k_img, v_img)
        o = sharding.constrain(o, TOKENS)
        o = checkpoint_name(o, "attn_out")
        return self.to_out.from_heads(o)

    def _head_major(self, x, ctx, attn: AttentionCall, sharding: ShardingContext, rope,
                    kv_mask, image, pre):
        """The layer in the head-major layout (module docstring): q/k/v ``[B, N, L, K]``
        from the projections, norm and RoPE in place, the output read by ``to_out``."""
        n = self.heads
        fused = fused_projections(self.projections, attn, sharding, x, self.to_q)
        if fused is not None and self._pre_fits(x, ctx, rope, pre):
            q, k, v = self._project_pre(x, ctx, rope, pre, fused)
        else:
            if pre is not None:
                x = pre_norm(x, *pre)
            ctx = x if ctx is None else ctx
            q, k, v = self._qkv(x, ctx, rope, fused)
        scale = None if fused is None else 1.0
        q = sharding.constrain(q, HEADS)
        if rope is not None:
            k = sharding.constrain(k, HEADS)
            v = sharding.constrain(v, HEADS)
        o = attn(q, k, v, kv_mask=kv_mask, scale=scale, head_major=True)
        if image is not None:
            k_img = rms_norm_heads(self.norm_added_k, self.add_k_proj.to_head_major(image, n))
            v_img = self.add_v_proj.to_head_major(image, n)
            o = o + attn(q, k_img, v_img, scale=scale, head_major=True)
        o = sharding.constrain(o, HEADS)
        o = checkpoint_name(o, "attn_out")
        return self.to_out.from_head_major(o)

    def _qkv(self, x, ctx, rope, fused):
        """q / k / v head-major from the layer's input: XLA's (``fused`` None) or q and the
        rotated k each through the projection kernel (the query scaled)."""
        n = self.heads
        if fused is None:
            q = rms_norm_heads(self.norm_q, self.to_q.to_head_major(x, n))
            k = rms_norm_heads(self.norm_k, self.to_k.to_head_major(ctx, n))
            if rope is not None:
                q = apply_rope(q, *rope, head_major=True)
                k = apply_rope(k, *rope, head_major=True)
        else:   # the query carries the softmax scale (the calls below get scale=1.0)
            dt = self.to_q.dtype
            q = project_many(x.astype(dt), self._layers("q", rope), rope, interpret=fused)[0]
            k = (project_many(ctx.astype(dt), self._layers("k", rope), rope, interpret=fused)[0]
                 if rope is not None     # text keys: XLA's
                 else rms_norm_heads(self.norm_k, self.to_k.to_head_major(ctx, n)))
        return q, k, self.to_v.to_head_major(ctx, n)

    def _layers(self, names: str, rope):
        """The projection kernel's ``(w, b, nw, spec)`` for each of ``names`` (``q``: normed,
        rotated with ``rope``, scaled by ``K ** -0.5``; ``k``: normed, rotated; ``v``: bare)."""
        head_dim = self.to_q.kernel.shape[-1]
        mods = {"q": (self.to_q, self.norm_q), "k": (self.to_k, self.norm_k),
                "v": (self.to_v, None)}
        return [(lin.kernel[...], None if lin.bias is None else lin.bias[...],
                 None if norm is None else norm.scale[...],
                 HeadProjection(norm=norm is not None, eps=getattr(norm, "eps", 1e-6),
                                rope=rope is not None and norm is not None,
                                scale=head_dim ** -0.5 if name == "q" else 1.0))
                for name, (lin, norm) in ((c, mods[c]) for c in names)]

    def _pre_fits(self, x, ctx, rope, pre) -> bool:
        """Whether the block's norm ``pre`` runs inside the projections' kernel: the input in
        the weights' dtype, one modulation per sample, and (self-attention: q, k and v in
        one kernel) the three kernels fitting VMEM."""
        if pre is None or x.dtype != self.to_q.dtype or any(
                t.ndim == 3 and t.shape[1] != 1 for t in pre[:2]):
            return False
        if ctx is not None:
            return True
        if type(self.to_v) is not Linear or self.to_v.quant is not None:
            return False
        return why_not(x, self.to_q.kernel[...], HeadProjection(rope=rope is not None),
                       count=3, pre=True) is None

    def _project_pre(self, x, ctx, rope, pre, interpret: bool):
        """q (cross-attention: k and v from ``ctx`` by XLA) or q, k, v (self-attention,
        ``ctx`` None) from the block's norm of ``x`` in one kernel (module docstring)."""
        t = head_projection.TRANSPOSED_INPUT         # read when traced (module docstring)
        outs = project_many(jnp.swapaxes(x, 1, 2) if t else x,
                            self._layers("qkv" if ctx is None else "q", rope), rope, pre,
                            transposed=t, interpret=interpret)
        if ctx is None:
            return outs
        n = self.heads
        return (outs[0], rms_norm_heads(self.norm_k, self.to_k.to_head_major(ctx, n)),
                self.to_v.to_head_major(ctx, n))


__all__ = ["WanAttention", "rms_norm_heads"]
