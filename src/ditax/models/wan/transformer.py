"""Wan 2.1 / 2.2 text-to-video transformer in Flax NNX (diffusers ``WanTransformer3DModel``).

Input and output use the diffusers layout ``[B, C, F, Y, X]``. Inside, tokens are
``[B, L, D]`` with ``L = F'·Y'·X'`` (frame-major). Blocks are stacked on a leading layer axis
and run with ``nnx.scan`` so compile time stays flat in depth; the remat policy comes from
config. Attention runs through one :class:`~ditax.attention.AttentionPlan`, built once from the
:class:`~ditax.attention.config.AttentionConfig`, the mesh and the model's heads / head dim /
dtype, and handed to every block (self- and cross-attention may use different backends).
The model holds its mesh once, in one :class:`~ditax.parallel.sharding.ShardingContext`; the
blocks, their layers and the attention calls get that same object (no layer keeps a mesh).
The attention layer (:mod:`ditax.models.wan.attention`) runs token- or head-major, as the
plan's kernels read without relayouts.

Numerics follow the reference: norms and the residual/gate arithmetic run in float32 and are
cast back to the compute dtype; RoPE rotates in float32 inside one fusion
(:func:`~ditax.nn.rope.apply_rope`), so no float32 copy of q or k is materialised.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.attention import AttentionPlan
from ditax.attention.config import AttentionConfig
from ditax.attention.sparse.layout import sparse_layout
from ditax.models.wan.attention import WanAttention
from ditax.models.wan.causal import causal_plan
from ditax.models.wan.config import WanConfig
from ditax.models.wan.embeddings import ConditionEmbedder, rope_cos_sin
from ditax.models.wan.feed_forward import FeedForward
from ditax.models.wan.image_embedder import check_image
from ditax.nn import FP32LayerNorm, Linear
from ditax.models.common.dit import DiT
from ditax.nn.stack import make_stack, run_stack
from ditax.parallel.sharding import ShardingContext


def modulation(table, mod) -> list:
    """The adaLN terms of ``table + mod`` in float32: ``table`` ``[1, n, D]`` (a block's or the
    output's ``scale_shift_table``), ``mod`` ``[B, n, D]`` (one timestep per sample: terms
    ``[B, 1, D]``) or ``[B, L, n, D]`` (per-token timesteps: terms ``[B, L, D]``)."""
    n = table.shape[1]
    if mod.ndim == 4:
        full = table.astype(jnp.float32)[None] + mod.astype(jnp.float32)
        return [full[:, :, i] for i in range(n)]
    full = table.astype(jnp.float32) + mod.astype(jnp.float32)
    return [full[:, i:i + 1] for i in range(n)]


class WanBlock(nnx.Module):
    """One Wan block: adaLN-modulated self-attention, cross-attention, adaLN-modulated FFN."""

    def __init__(self, cfg: WanConfig, *, rngs, gated: bool = False):
        d = cfg.inner_dim
        pd = jnp.dtype(cfg.param_dtype)
        self.norm1 = FP32LayerNorm(d, cfg.eps, affine=False, param_dtype=pd)
        self.attn1 = WanAttention(cfg, rngs=rngs, gated=gated)   # gated: attention.sparsity=vsa
        self.norm2 = FP32LayerNorm(d, cfg.eps, affine=cfg.cross_attn_norm, param_dtype=pd)
        self.attn2 = WanAttention(cfg, rngs=rngs, added_kv=cfg.added_kv_proj_dim is not None)
        self.ffn = FeedForward(d, cfg.ffn_dim, dtype=cfg.dtype, param_dtype=pd, rngs=rngs)
        self.norm3 = FP32LayerNorm(d, cfg.eps, affine=False, param_dtype=pd)
        self.scale_shift_table = nnx.Param(
            jax.random.normal(rngs.params(), (1, 6, d), pd) / d ** 0.5)
        self.cross_attn_norm = cfg.cross_attn_norm

    def __call__(self, x, text, mod, rope, token_mask, text_mask, attn: AttentionPlan,
                 sharding: ShardingContext, image=None):
        """x ``[B, L, D]``, text ``[B, T, D]``, mod ``[B, 6, D]`` (per-token timesteps:
        ``[B, L, 6, D]``), rope (cos, sin);
        ``attn`` the model's attention plan; ``sharding`` the model's context (constrains the
        activations); ``image`` ``[B, S, D]`` embedded image tokens (image-to-video models)."""
        dt = x.dtype
        shift, scale, gate, c_shift, c_scale, c_gate = modulation(self.scale_shift_table[...],
                                                                  mod)

        # norm1 with the adaLN terms (inside the fused projections' kernel where they run)
        h = self.attn1(x, None, attn.self_attn, sharding, rope=rope, kv_mask=token_mask,
                       pre=(1 + scale, shift, self.norm1.eps))
        x = (x.astype(jnp.float32) + h.astype(jnp.float32) * gate).astype(dt)
        x = sharding.constrain(x, ("act_batch", "act_seq", "act_embed"))

        pre = ((self.norm2.scale[...].astype(jnp.float32), self.norm2.bias[...].astype(
            jnp.float32), self.norm2.eps) if self.cross_attn_norm else None)     # norm2
        h = self.attn2(x, text, attn.cross_attn, sharding, kv_mask=text_mask, image=image,
                       pre=pre)
        x = x + h.astype(dt)

        h = (self.norm3(x) * (1 + c_scale) + c_shift).astype(dt)
        h = self.ffn(h, sharding)
        x = (x.astype(jnp.float32) + h.astype(jnp.float32) * c_gate).astype(dt)
        return sharding.constrain(x, ("act_batch", "act_seq", "act_embed"))


def patch_embedding(cfg: WanConfig, channels: int, rngs: nnx.Rngs) -> tuple[nnx.Param, nnx.Param]:
    """A patch embedding's kernel ``[pt, ph, pw, channels, D]`` (normal / sqrt(fan in)) and
    bias ``[D]`` (zeros), in ``cfg.param_dtype``: the latents', VACE's control and Animate's
    pose embeddings."""
    pt, ph, pw = cfg.patch_size
    d, pd = cfg.inner_dim, jnp.dtype(cfg.param_dtype)
    fan_in = channels * pt * ph * pw
    kernel = nnx.Param(jax.random.normal(rngs.params(), (pt, ph, pw, channels, d), pd)
                       / fan_in ** 0.5)
    return kernel, nnx.Param(jnp.zeros((d,), pd))


class WanTransformer(DiT):
    """Wan text-to-video DiT. ``model(latents [B,C,F,Y,X], t [B], text [B,T,Dt]) → [B,C,F,Y,X]``.

    Args:
      cfg: model shape and numerics (dtypes, remat, layer scan).
      attention: attention backends / options (an :class:`AttentionConfig` or a backend
        name); defaults to ``xla`` everywhere.
      mesh: optional device mesh; activations are constrained by the logical rules and the
        sequence is padded (padded keys masked) to a multiple of ``mesh.context``.

    The configs are checked by the entry points, once, before a module is built
    (:func:`ditax.models.wan.config.check_transformer`), not here.
    """

    def __init__(self, cfg: WanConfig, attention: AttentionConfig | str | None = None,
                 mesh=None, *, rngs: nnx.Rngs):
        self.setup(cfg, attention, mesh)
        d = cfg.inner_dim
        pt, ph, pw = cfg.patch_size
        pd = jnp.dtype(cfg.param_dtype)
        kw = dict(dtype=cfg.dtype, param_dtype=pd, rngs=rngs)
        self.patch_embedding_kernel, self.patch_embedding_bias = patch_embedding(
            cfg, cfg.in_channels, rngs)
        self.condition_embedder = ConditionEmbedder(
            d, cfg.freq_dim, cfg.text_dim, image_dim=cfg.image_dim,
            pos_embed_seq_len=cfg.pos_embed_seq_len, **kw)

        gated = getattr(self.attention, "sparsity", "none") == "vsa"
        self.blocks = make_stack(lambda r: WanBlock(cfg, rngs=r, gated=gated), cfg.num_layers,
                                 rngs)
        self.norm_out = FP32LayerNorm(d, cfg.eps, affine=False, param_dtype=pd)
        self.proj_out = Linear(d, cfg.out_channels * pt * ph * pw, **kw)
        self.scale_shift_table = nnx.Param(jax.random.normal(rngs.params(), (1, 2, d), pd)
                                           / d ** 0.5)

    def optional_rows(self) -> list:
        """Weight rows of the parameters the attention config adds (``vsa``'s gates, zero
        where a checkpoint has none): the loader reads them beside the table's."""
        from ditax.models.wan.convert import gate_rows

        return gate_rows() if getattr(self.attention, "sparsity", "") == "vsa" else []

    # ------------------------------------------------------------------------------------------

    def check_inputs(self, latents, timestep, text, text_mask=None, image=None):
        """Raise ValueError with the offending shapes for inputs the model cannot take."""
        cfg = self.cfg
        if latents.ndim != 5:
            raise ValueError(f"latents must be [B, C, F, Y, X] (rank 5); got shape {latents.shape}")
        b, c, f, y, x = latents.shape
        if c != cfg.in_channels:
            raise ValueError(f"latents have {c} channels; the model expects "
                             f"in_channels={cfg.in_channels}")
        for name, n, p in zip(("frames", "height", "width"), (f, y, x), cfg.patch_size):
            if n % p:
                raise ValueError(f"latent {name}={n} is not divisible by the patch size {p} "
                                 f"(patch_size={cfg.patch_size}); crop or pad the latents")
        if text.ndim != 3 or text.shape[0] != b:
            raise ValueError(f"encoder_hidden_states must be [B={b}, T, {cfg.text_dim}]; "
                             f"got {text.shape}")
        if text.shape[-1] != cfg.text_dim:
            raise ValueError(f"encoder_hidden_states width {text.shape[-1]} != model text_dim="
                             f"{cfg.text_dim}; use the matching text encoder")
        t = jnp.asarray(timestep)
        seq = (f // cfg.patch_size[0]) * (y // cfg.patch_size[1]) * (x // cfg.patch_size[2])
        if t.ndim > 2 or (t.ndim >= 1 and t.shape[0] not in (1, b)) or (
                t.ndim == 2 and t.shape[1] != seq):
            raise ValueError(f"timestep must be a scalar, [B={b}] or per token [B={b}, L={seq}] "
                             f"(L = latent tokens); got shape {t.shape}")
        if text_mask is not None and tuple(text_mask.shape) != tuple(text.shape[:2]):
            raise ValueError(f"text_mask must be [B, T] = {tuple(text.shape[:2])}; "
                             f"got {tuple(text_mask.shape)}")
        check_image(cfg, b, image)
        self.sharding.check_batch(b)
        self.sharding.check_heads(cfg.num_attention_heads)

    def __call__(self, latents, timestep, encoder_hidden_states, text_mask=None,
                 encoder_hidden_states_image=None):
        """Denoiser prediction for ``latents [B, C, F, Y, X]`` → ``[B, C_out, F, Y, X]``.

        ``timestep``: ``[B]`` (or a scalar), or per token ``[B, L]`` with ``L`` the latent
        tokens in frame-major order (Wan 2.2 TI2V: the first frame's tokens at t=0).

        ``encoder_hidden_states_image``: CLIP features ``[B, S, image_dim]`` for
        image-to-video models (first-last-frame: ``[2B, S, image_dim]``, see
        :class:`~ditax.models.wan.image_embedder.ImageEmbedder`); None for text-to-video.

        The three parts :meth:`embed`, :meth:`run_blocks` and :meth:`head` are public so that
        a sampler can run part of the blocks (step caching, :mod:`ditax.pipelines.cache.step_cache`).
        """
        h, ctx = self.embed(latents, timestep, encoder_hidden_states, text_mask,
                            encoder_hidden_states_image)
        return self.head(self.run_blocks(h, ctx), ctx)

    def embed(self, latents, timestep, encoder_hidden_states, text_mask=None,
              encoder_hidden_states_image=None) -> tuple[jax.Array, "Embedded"]:
        """Tokens ``h [B, L', D]`` (L' = tokens padded to the context shards) and what the
        blocks and the head need (:class:`Embedded`)."""
        image = encoder_hidden_states_image
        self.check_inputs(latents, timestep, encoder_hidden_states, text_mask, image)
        cfg, sharding = self.cfg, self.sharding
        dt = jnp.dtype(cfg.dtype)
        b, c, fr, hh, ww = latents.shape
        pt, ph, pw = cfg.patch_size
        f, y, x = fr // pt, hh // ph, ww // pw
        seq = f * y * x

        # patchify: [B, C, F, Y, X] -> [B, f, y, x, pt, ph, pw, C] -> tokens [B, L, D]
        xp = latents.astype(dt).reshape(b, c, f, pt, y, ph, x, pw)
        xp = xp.transpose(0, 2, 4, 6, 3, 5, 7, 1).reshape(b, seq, pt * ph * pw * c)
        # patches sharded like the tokens, so the embedding is computed where its tokens live
        # (computed replicated over a D-sharded kernel, XLA exchanged the tokens and relaid
        # them out: two activation copies per forward on TPU)
        xp = sharding.constrain(xp, ("act_batch", "act_seq", None))
        kern = self.patch_embedding_kernel[...].astype(dt).reshape(pt * ph * pw * c, -1)
        h = jnp.einsum("blc,cd->bld", xp, kern) + self.patch_embedding_bias[...].astype(dt)

        timestep = jnp.asarray(timestep)
        timestep = jnp.broadcast_to(timestep, (b, seq) if timestep.ndim == 2 else (b,))
        temb, mod, text = self.condition_embedder(timestep, encoder_hidden_states.astype(dt))
        text = text.astype(dt)
        if image is not None:
            image = self.condition_embedder.image_embedder(jnp.asarray(image).astype(dt))
        cos, sin = rope_cos_sin(cfg.attention_head_dim, (f, y, x), cfg.rope_max_seq_len)

        # pad the sequence to a multiple of the context shards; padded keys are masked
        tiles = sparse_layout(self.attention, (f, y, x), sharding.seq_shards)
        pad = (-(seq if tiles is None else tiles.order.length)) % sharding.seq_shards
        token_mask = None
        if tiles is not None:   # block-sparse: tile-major, whole tiles a shard (no pad here)
            h, cos, sin = tiles.to_tiles(h), tiles.to_tiles(cos, 0), tiles.to_tiles(sin, 0)
            mod = tiles.to_tiles(mod) if mod.ndim == 4 else mod
            token_mask = tiles.kv_mask(b)
        if pad:
            h = jnp.pad(h, ((0, 0), (0, pad), (0, 0)))
            cos = jnp.pad(cos, ((0, pad), (0, 0)))
            sin = jnp.pad(sin, ((0, pad), (0, 0)))
            token_mask = jnp.broadcast_to(jnp.arange(seq + pad) < seq, (b, seq + pad))
        copies = 0 if pad or tiles is not None else self.token_copies(seq)
        if copies:   # the first tokens again, with their RoPE rows: keys equal to real ones
            h = jnp.concatenate([h, h[:, :copies]], axis=1)
            cos, sin = (jnp.concatenate([t, t[:copies]]) for t in (cos, sin))
        h = sharding.constrain(h, ("act_batch", "act_seq", "act_embed"))
        if mod.ndim == 4:  # per-token modulation follows its tokens
            mod = jnp.pad(mod, ((0, 0), (0, pad), (0, 0), (0, 0))) if pad else mod
            mod = jnp.concatenate([mod, mod[:, :copies]], axis=1) if copies else mod
            mod = sharding.constrain(mod, ("act_batch", "act_seq", None, "act_embed"))
        return h, Embedded(text=text, temb=temb, mod=mod, rope=(cos, sin),
                           token_mask=token_mask, text_mask=text_mask, image=image,
                           shape=tuple(latents.shape), dtype=latents.dtype, seq=seq,
                           pad=pad + copies, tiles=tiles, copies=copies)

    #: whether :meth:`embed` may append copies of the first tokens (:meth:`token_copies`);
    #: off in the subclasses that add to the tokens after it (VACE's hints, Animate's
    #: adapters), which would make the copies' keys differ from the real ones
    TOKEN_COPIES = True

    def token_copies(self, seq: int) -> int:
        """Copies of the first tokens :meth:`embed` appends to the ``seq`` tokens, once per
        forward, where the self-attention kernel would pad its keys with such copies in
        every layer anyway (splash on a TPU, :meth:`~ditax.attention.AttentionCall.
        token_copies`: Wan 1.3B 480p, 32,760 tokens + 8): q, k and v then reach it at a
        whole number of its blocks with no pad pass each, the copies' keys are kept out
        exactly (``copied_keys``) and :meth:`head` drops their rows. Not with a
        block-causal config (``model.causal_chunk``: its chunk programs size their own
        keys)."""
        if not self.TOKEN_COPIES or getattr(self.cfg, "causal_chunk", None) is not None:
            return 0
        return self.attention_plan.self_attn.token_copies(seq)

    @property
    def block_stacks(self) -> tuple[tuple[str, int], ...]:
        """The one stack of blocks (:class:`ditax.models.base.Denoiser`)."""
        return (("blocks", self.cfg.num_layers),)

    def run_blocks(self, h, ctx: "Embedded", start: int = 0, stop: int | None = None,
                   plan: AttentionPlan | None = None):
        """Blocks ``start .. stop-1`` (default: all) on tokens ``h [B, L', D]`` with attention
        ``plan`` (None: the model's; block-causal with ``model.causal_chunk``,
        :func:`~ditax.models.wan.causal.causal_plan`)."""
        cfg, sharding = self.cfg, self.sharding
        plan = causal_plan(self, ctx) if plan is None else plan

        def body(hs, block):
            return block(hs, ctx.text, ctx.mod, ctx.rope, ctx.token_mask, ctx.text_mask, plan,
                         sharding, ctx.image)

        # scanned (a sub-range: over layer indices, weights read in place) or unrolled, each
        # block under the remat policy (ditax.nn.stack)
        return run_stack(self.blocks, body, h, depth=cfg.num_layers, start=start, stop=stop,
                         remat=cfg.remat, scan=cfg.scan_layers, prefetch=cfg.offload_prefetch)

    def head(self, h, ctx: "Embedded"):
        """Output norm, projection and unpatchify: tokens ``[B, L', D]`` → ``[B, C_out, F, Y,
        X]`` in the latents' dtype."""
        cfg, sharding = self.cfg, self.sharding
        dt = jnp.dtype(cfg.dtype)
        b, _, fr, hh, ww = ctx.shape
        pt, ph, pw = cfg.patch_size
        f, y, x = fr // pt, hh // ph, ww // pw
        if ctx.pad:
            h = h[:, :ctx.seq]
            h = sharding.constrain(h, ("act_batch", None, "act_embed"))
        if ctx.tiles is not None:   # back to frame-major order, the tiles' padding dropped
            h = ctx.tiles.from_tiles(h)
        temb = ctx.temb[..., None, :]  # [B, 1, D] or per token [B, L, 1, D]
        shift, scale = modulation(self.scale_shift_table[...], temb)
        h = (self.norm_out(h) * (1 + scale) + shift).astype(dt)
        h = sharding.constrain(self.proj_out(h), ("act_batch", None, "act_channels"))
        co = cfg.out_channels
        h = h.reshape(b, f, y, x, pt, ph, pw, co).transpose(0, 7, 1, 4, 2, 5, 3, 6)
        return h.reshape(b, co, fr, hh, ww).astype(ctx.dtype)


class Embedded(NamedTuple):
    """What :meth:`WanTransformer.embed` hands to the blocks and the head: text ``[B, T, D]``,
    ``temb [B, D]`` (time embedding) and ``mod [B, 6, D]`` (its projection: the blocks'
    modulation), rope (cos, sin), masks, embedded image tokens, and the latents' shape /
    dtype, the token count ``seq`` and its padding ``pad`` (static); VACE models add their
    control hints ``[n, B, L', D]`` and scales ``[B, n]`` (:mod:`ditax.models.wan.vace`).
    ``tiles``: with ``attention.sparsity``, the tokens' tile-major layout (static,
    :class:`~ditax.attention.sparse.layout.SparseLayout`; tokens, RoPE tables, per-token
    modulation and ``token_mask`` are in its order), else None. ``copies``: how many of
    the ``pad`` rows are copies of the first tokens (:meth:`WanTransformer.token_copies`;
    the rest zeros, masked by ``token_mask``)."""

    text: jax.Array
    temb: jax.Array
    mod: jax.Array
    rope: tuple
    token_mask: Any
    text_mask: Any
    image: Any
    shape: tuple
    dtype: Any
    seq: int
    pad: int
    hints: Any = None
    hint_scale: Any = None
    tiles: Any = None
    copies: int = 0

    def plan(self, plan: AttentionPlan) -> AttentionPlan:
        """The plan the blocks run: with ``tiles`` its self-attention reads their table;
        with ``copies`` (the last tokens copy the first, :meth:`WanTransformer.
        token_copies`) it keeps their keys out."""
        if self.copies:
            plan = dataclasses.replace(plan, self_attn=plan.self_attn.with_copies(self.copies))
        return plan if self.tiles is None else self.tiles.plan(plan)
