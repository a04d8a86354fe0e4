"""FLUX.1 transformer in Flax NNX (diffusers ``FluxTransformer2DModel``).

``model(hidden_states [B, L, C_in], timestep [B] in [0, 1], encoder_hidden_states [B, T, Dt],
pooled_projections=[B, Dp], img_ids=[L, n], txt_ids=[T, n], guidance=[B] | None) →
[B, L, C_out]`` — packed image tokens in and out, as diffusers; the arguments in the order of
the family protocol (:class:`ditax.models.base.Denoiser`: input, timestep, text, then the
family's extras as keywords). ``ditax.load_transformer`` returns a callable in diffusers'
own order (:class:`ditax.models.flux.loading.FluxTransformerModel`).

Inside, ``num_layers`` double-stream blocks run on (image, text) and then
``num_single_layers`` single-stream blocks on the joint sequence, laid out by
:class:`~ditax.models.common.joint_layout.JointLayout`: on ``c`` context shards text and image are
each padded to a multiple of ``c`` and placed shard-major (each shard: its image tokens, then
its text tokens), so joining and splitting the streams moves nothing between devices and
``ulysses`` / ``ring`` / ``ulysses_ring`` see one evenly split sequence; the pad tokens are
masked as keys. Each stack is one module with a leading layer axis, run scanned and under
the configured remat policy (:mod:`ditax.nn.stack`). Attention runs through one
:class:`~ditax.attention.AttentionPlan` (its ``self_attn`` call: every block's attention is
joint self-attention); the model holds its mesh once, in a
:class:`~ditax.parallel.sharding.ShardingContext`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.attention import registry
from ditax.attention.sequence.plan import ring_ulysses
from ditax.attention.config import AttentionConfig
from ditax.errors import RequestError
from ditax.models.flux.blocks import TOKENS, AdaNorm, DoubleBlock, SingleBlock
from ditax.models.flux.config import FluxConfig
from ditax.models.flux.embeddings import TimeTextEmbed, rope_cos_sin
from ditax.models.common.joint_layout import JointLayout, check_length_masks
from ditax.nn import Linear
from ditax.models.common.dit import DiT
from ditax.nn.stack import make_stack, run_stack


class Embedded(NamedTuple):
    """What :meth:`FluxTransformer.embed` hands the blocks and the head: ``temb [B, D]`` (the
    conditioning every block modulates with; also ``mod``), rope (cos, sin) ``[S', K]`` and
    ``kv_mask [B, S']`` (or None) of the joint ``layout``, the output dtype, and ``seq``: the
    joint tokens ``S'`` (pad tokens included when the layout pads)."""

    temb: jax.Array
    mod: jax.Array
    rope: tuple
    kv_mask: Any
    layout: JointLayout
    dtype: Any
    seq: int


class FluxTransformer(DiT):
    """Flux DiT (see the module docstring for the call).

    Args:
      cfg: model shape and numerics (dtypes, remat, layer scan); checked by the entry points
        (:func:`ditax.models.flux.config.check_transformer`), not here.
      attention: attention backend / options (an :class:`AttentionConfig` or a backend name).
      mesh: optional device mesh; activations are constrained by the logical rules.
    """

    def __init__(self, cfg: FluxConfig, attention: AttentionConfig | str | None = None,
                 mesh=None, *, rngs: nnx.Rngs):
        self.setup(cfg, attention, mesh)
        d = cfg.inner_dim
        kw = dict(dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs)
        self.x_embedder = Linear(cfg.in_channels, d, **kw)
        self.context_embedder = Linear(cfg.joint_attention_dim, d, **kw)
        self.time_text_embed = TimeTextEmbed(d, cfg.pooled_projection_dim, cfg.guidance_embeds,
                                             **kw)
        self.transformer_blocks = make_stack(lambda r: DoubleBlock(cfg, rngs=r),
                                             cfg.num_layers, rngs)
        self.single_transformer_blocks = make_stack(lambda r: SingleBlock(cfg, rngs=r),
                                                    cfg.num_single_layers, rngs)
        self.norm_out = AdaNorm(d, 2, **kw)
        self.proj_out = Linear(d, cfg.output_channels, **kw)


    @property
    def block_stacks(self) -> tuple[tuple[str, int], ...]:
        """Double-stream blocks, then single-stream blocks (:class:`~ditax.models.base.Denoiser`)."""
        return (("transformer_blocks", self.cfg.num_layers),
                ("single_transformer_blocks", self.cfg.num_single_layers))

    # ------------------------------------------------------------------------------------------

    def check_inputs(self, hidden_states, timestep, encoder_hidden_states, *, pooled_projections,
                     img_ids, txt_ids, guidance=None, text_mask=None):
        """Raise :class:`~ditax.errors.RequestError` naming the shapes for inputs the model
        cannot take."""
        cfg = self.cfg
        x, text, pooled = hidden_states, encoder_hidden_states, pooled_projections
        n_axes = len(cfg.axes_dims_rope)
        if x.ndim != 3 or x.shape[-1] != cfg.in_channels:
            raise RequestError(f"hidden_states must be packed tokens [B, L, in_channels="
                               f"{cfg.in_channels}]; got shape {tuple(x.shape)}")
        b, seq = x.shape[:2]
        if text.ndim != 3 or text.shape[0] != b or text.shape[-1] != cfg.joint_attention_dim:
            raise RequestError(f"encoder_hidden_states must be [B={b}, T, joint_attention_dim="
                               f"{cfg.joint_attention_dim}]; got shape {tuple(text.shape)}")
        if pooled is None or tuple(pooled.shape) != (b, cfg.pooled_projection_dim):
            raise RequestError(f"pooled_projections must be [B={b}, pooled_projection_dim="
                               f"{cfg.pooled_projection_dim}]; got "
                               f"{None if pooled is None else tuple(pooled.shape)}")
        for name, ids, n in (("img_ids", img_ids, seq), ("txt_ids", txt_ids, text.shape[1])):
            if ids is None or tuple(ids.shape) != (n, n_axes):
                got = None if ids is None else tuple(ids.shape)
                raise RequestError(f"{name} must be [{n}, {n_axes}] (one position per token and "
                                   f"rope axis; diffusers' 3-D ids: pass ids[0]); got {got}")
        for name, v in (("timestep", timestep), ("guidance", guidance)):
            if v is not None and (v.ndim > 1 or (v.ndim == 1 and v.shape[0] not in (1, b))):
                raise RequestError(f"{name} must be a scalar or [B={b}]; got shape "
                                   f"{tuple(v.shape)}")
        if cfg.guidance_embeds and guidance is None:
            raise RequestError("guidance=None, but this model embeds a guidance scale "
                               "(guidance_embeds, FLUX.1-dev): pass guidance=[B] (e.g. 3.5)")
        if not cfg.guidance_embeds and guidance is not None:
            raise RequestError("guidance is given, but this model has no guidance embedding "
                               "(guidance_embeds=False, FLUX.1-schnell): pass guidance=None")
        if text_mask is not None and tuple(text_mask.shape) != tuple(text.shape[:2]):
            raise RequestError(f"text_mask must be [B, T] = {tuple(text.shape[:2])}; got "
                               f"{tuple(text_mask.shape)}")
        self.sharding.check_batch(b)
        self.sharding.check_heads(cfg.num_attention_heads)

    def _check_length_masks(self, layout: JointLayout, text_mask) -> None:
        """A kernel that takes key masks as lengths (cudnn, te) gets a prefix joint mask, or
        :func:`~ditax.models.common.joint_layout.check_length_masks` refuses before tracing."""
        call = self.attention_plan.self_attn
        kernel = call.local()[0]
        if registry.BACKENDS[kernel].masks != "prefix":
            return
        ring = call.entry.kind == "sequence" and ring_ulysses(
            call.backend, layout.shards, call.options)[0] > 1
        check_length_masks(layout, kernel, text_mask is not None, ring)

    def __call__(self, hidden_states, timestep, encoder_hidden_states, *, pooled_projections,
                 img_ids, txt_ids, guidance=None, text_mask=None):
        """The prediction ``[B, L, C_out]``; ``text_mask [B, T]`` (optional, True = token)
        masks text keys (diffusers' pipeline attends to every text token: None)."""
        h, ctx = self.embed(hidden_states, timestep, encoder_hidden_states,
                            pooled_projections=pooled_projections, img_ids=img_ids,
                            txt_ids=txt_ids, guidance=guidance, text_mask=text_mask)
        return self.head(self.run_blocks(h, ctx), ctx)

    def embed(self, hidden_states, timestep, encoder_hidden_states, *, pooled_projections,
              img_ids, txt_ids, guidance=None, text_mask=None) -> tuple[jax.Array, Embedded]:
        """Joint tokens ``h [B, S', D]`` (:class:`JointLayout`) and the blocks' context."""
        timestep = jnp.asarray(timestep)
        guidance = None if guidance is None else jnp.asarray(guidance)
        self.check_inputs(hidden_states, timestep, encoder_hidden_states,
                          pooled_projections=pooled_projections, img_ids=img_ids,
                          txt_ids=txt_ids, guidance=guidance, text_mask=text_mask)
        cfg, sharding = self.cfg, self.sharding
        dt = jnp.dtype(cfg.dtype)
        b, seq = hidden_states.shape[:2]
        layout = JointLayout(seq, encoder_hidden_states.shape[1], sharding.seq_shards)
        self._check_length_masks(layout, text_mask)

        # diffusers scales the [0, 1] timestep (and the guidance) by 1000 in the model dtype
        t = jnp.broadcast_to(timestep.astype(dt), (b,)) * 1000
        g = None if guidance is None else jnp.broadcast_to(guidance.astype(dt), (b,)) * 1000
        temb = self.time_text_embed(t, jnp.asarray(pooled_projections).astype(dt), g)

        x = sharding.constrain(jnp.asarray(hidden_states).astype(dt), ("act_batch", "act_seq",
                                                                        None))
        img = layout.pad(self.x_embedder(x), 1, image=True)
        txt = layout.pad(self.context_embedder(jnp.asarray(encoder_hidden_states).astype(dt)),
                         1, image=False)
        h = sharding.constrain(layout.join(img, txt), TOKENS)
        ids = layout.join(layout.pad(jnp.asarray(img_ids, jnp.float32), 0, image=True),
                          layout.pad(jnp.asarray(txt_ids, jnp.float32), 0, image=False), axis=0)
        cos, sin = (sharding.constrain(r, ("act_seq", None))
                    for r in rope_cos_sin(ids, cfg.axes_dims_rope))
        kv_mask = layout.key_mask(b, text_mask)
        return h, Embedded(temb=temb, mod=temb, rope=(cos, sin), kv_mask=kv_mask,
                           layout=layout, dtype=jnp.asarray(hidden_states).dtype,
                           seq=layout.length)

    def run_blocks(self, h, ctx: Embedded, start: int = 0, stop: int | None = None):
        """Blocks ``start .. stop-1`` (default all; numbered double blocks first, then single
        blocks) on the joint tokens ``h [B, S', D]``."""
        cfg = self.cfg
        nd, ns = cfg.num_layers, cfg.num_single_layers
        stop = nd + ns if stop is None else stop
        if not 0 <= start <= stop <= nd + ns:
            raise ValueError(f"blocks {start}..{stop} outside 0..{nd + ns}")
        attn, sharding, layout = self.attention_plan.self_attn, self.sharding, ctx.layout
        run = dict(remat=cfg.remat, scan=cfg.scan_layers, prefetch=cfg.offload_prefetch)

        def double(streams, block):
            return block(streams, ctx.temb, ctx.rope, ctx.kv_mask, layout, attn, sharding)

        def single(x, block):
            return block(x, ctx.temb, ctx.rope, ctx.kv_mask, attn, sharding)

        if start < min(stop, nd):
            streams = run_stack(self.transformer_blocks, double, layout.split(h), depth=nd,
                                start=start, stop=min(stop, nd), what="double blocks", **run)
            h = sharding.constrain(layout.join(*streams), TOKENS)
        if stop > nd:
            h = run_stack(self.single_transformer_blocks, single, h, depth=ns,
                          start=max(start - nd, 0), stop=stop - nd, what="single blocks", **run)
        return h

    def head(self, h, ctx: Embedded):
        """Output norm and projection of the image tokens: ``[B, S', D]`` → ``[B, L, C_out]``
        in the input's dtype."""
        layout, sharding = ctx.layout, self.sharding
        img = layout.split(h)[0]
        if layout.image_padded != layout.image:
            img = sharding.constrain(img[:, :layout.image], ("act_batch", None, "act_embed"))
        scale, shift = self.norm_out.terms(ctx.temb)     # AdaLayerNormContinuous: scale first
        out = self.proj_out(self.norm_out.modulate(img, shift, scale))
        return sharding.constrain(out, ("act_batch", "act_seq", "act_channels")).astype(ctx.dtype)


__all__ = ["FluxTransformer", "Embedded"]
