"""FLUX.2 transformer in Flax NNX (diffusers ``Flux2Transformer2DModel``).

``model(hidden_states [B, L, C_in], encoder_hidden_states [B, T, Dt], timestep [B] in [0, 1],
img_ids [L, 4] | [B, L, 4], txt_ids [T, 4] | [B, T, 4], guidance [B] | None) → [B, L, C_out]``
— diffusers' own argument order (3-D ids: the first row is used, as diffusers does); packed
image tokens in and out. Reference-image tokens of image-conditioned sampling are more image
tokens with their own ids (the pipeline appends them and drops their outputs).

Inside: the time (+ guidance) embedding, three shared modulations of it (image and text
stream of the double blocks, the single blocks), ``num_layers`` double-stream blocks on
(image, text), then ``num_single_layers`` single-stream blocks on the joint sequence, laid out
by :class:`~ditax.models.common.joint_layout.JointLayout` (on ``c`` context shards each stream padded
to a multiple of ``c`` and placed shard-major, so joining and splitting the streams moves
nothing between devices and ``ulysses`` / ``ring`` / ``ulysses_ring`` see one evenly split
sequence; pad tokens are masked as keys). Each stack is one module with a leading layer axis,
run scanned and under the configured remat policy (:mod:`ditax.nn.stack`). Attention runs
through one :class:`~ditax.attention.AttentionPlan` (``self_attn``: every block's attention
is joint self-attention).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.attention import registry
from ditax.attention.config import AttentionConfig
from ditax.attention.sequence.plan import ring_ulysses
from ditax.errors import RequestError
from ditax.models.common.dit import DiT
from ditax.models.common.joint_layout import JointLayout, check_length_masks
from ditax.models.flux2.blocks import TOKENS, DoubleBlock, SingleBlock, modulate
from ditax.models.flux2.config import Flux2Config
from ditax.models.flux2.embeddings import (Modulation, TimeGuidanceEmbed, mod_terms,
                                           rope_cos_sin)
from ditax.nn import FP32LayerNorm, Linear
from ditax.nn.stack import make_stack, run_stack

#: a per-sample vector ``[B, ·]`` (the time embedding, the modulations): split over the batch
ROWS = ("act_batch", None)


class Embedded(NamedTuple):
    """What :meth:`Flux2Transformer.embed` hands the blocks and the head: ``temb [B, D]``,
    ``mod`` = (image, text, single) modulations ``[B, 6D], [B, 6D], [B, 3D]`` float32, rope
    (cos, sin) ``[S', K]`` and ``kv_mask [B, S']`` (or None) of the joint ``layout``, the
    output dtype, and ``seq``: the joint tokens ``S'``."""

    temb: jax.Array
    mod: tuple
    rope: tuple
    kv_mask: Any
    layout: JointLayout
    dtype: Any
    seq: int


def _ids(ids):
    """Position ids as ``[S, n]`` float32: diffusers' 3-D ids ``[B, S, n]`` give their first
    row (diffusers uses ``ids[0]``)."""
    ids = jnp.asarray(ids, jnp.float32)
    return ids[0] if ids.ndim == 3 else ids


class Flux2Transformer(DiT):
    """FLUX.2 DiT (see the module docstring for the call).

    Args:
      cfg: model shape and numerics; checked by the entry points
        (:func:`ditax.models.flux2.config.check_transformer`), not here.
      attention: attention backend / options (an :class:`AttentionConfig` or a backend name).
      mesh: optional device mesh; activations are constrained by the logical rules.
    """

    def __init__(self, cfg: Flux2Config, attention: AttentionConfig | str | None = None,
                 mesh=None, *, rngs: nnx.Rngs):
        self.setup(cfg, attention, mesh)
        d = cfg.inner_dim
        kw = dict(dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs)
        self.time_guidance_embed = TimeGuidanceEmbed(cfg.timestep_guidance_channels, d,
                                                     cfg.guidance_embeds, **kw)
        self.double_stream_modulation_img = Modulation(d, 6, **kw)
        self.double_stream_modulation_txt = Modulation(d, 6, **kw)
        self.single_stream_modulation = Modulation(d, 3, **kw)
        self.x_embedder = Linear(cfg.in_channels, d, bias=False, **kw)
        self.context_embedder = Linear(cfg.joint_attention_dim, d, bias=False, **kw)
        self.transformer_blocks = make_stack(lambda r: DoubleBlock(cfg, rngs=r),
                                             cfg.num_layers, rngs)
        self.single_transformer_blocks = make_stack(lambda r: SingleBlock(cfg, rngs=r),
                                                    cfg.num_single_layers, rngs)
        self.norm_out = Modulation(d, 2, **kw)     # AdaLayerNormContinuous's linear
        self.norm_out_ln = FP32LayerNorm(d, cfg.eps, affine=False, param_dtype=cfg.param_dtype)
        self.proj_out = Linear(d, cfg.output_channels, bias=False, **kw)

    @property
    def block_stacks(self) -> tuple[tuple[str, int], ...]:
        """Double-stream blocks, then single-stream blocks
        (:class:`~ditax.models.base.Denoiser`)."""
        return (("transformer_blocks", self.cfg.num_layers),
                ("single_transformer_blocks", self.cfg.num_single_layers))

    # ------------------------------------------------------------------------------------------

    def check_inputs(self, hidden_states, encoder_hidden_states, timestep, img_ids, txt_ids,
                     guidance=None, text_mask=None):
        """Raise :class:`~ditax.errors.RequestError` naming the shapes for inputs the model
        cannot take."""
        cfg = self.cfg
        x, text = hidden_states, encoder_hidden_states
        n_axes = len(cfg.axes_dims_rope)
        if x.ndim != 3 or x.shape[-1] != cfg.in_channels:
            raise RequestError(f"hidden_states must be packed tokens [B, L, in_channels="
                               f"{cfg.in_channels}]; got shape {tuple(x.shape)}")
        b, seq = x.shape[:2]
        if text.ndim != 3 or text.shape[0] != b or text.shape[-1] != cfg.joint_attention_dim:
            raise RequestError(f"encoder_hidden_states must be [B={b}, T, joint_attention_dim="
                               f"{cfg.joint_attention_dim}]; got shape {tuple(text.shape)}")
        for name, ids, n in (("img_ids", img_ids, seq), ("txt_ids", txt_ids, text.shape[1])):
            shape = None if ids is None else tuple(ids.shape)
            if shape is None or shape[-2:] != (n, n_axes) or len(shape) not in (2, 3):
                raise RequestError(f"{name} must be [{n}, {n_axes}] or [B, {n}, {n_axes}] (one "
                                   f"position per token and rope axis); got {shape}")
        for name, v in (("timestep", timestep), ("guidance", guidance)):
            if v is not None and (v.ndim > 1 or (v.ndim == 1 and v.shape[0] not in (1, b))):
                raise RequestError(f"{name} must be a scalar or [B={b}]; got shape "
                                   f"{tuple(v.shape)}")
        if cfg.guidance_embeds and guidance is None:
            raise RequestError("guidance=None, but this model embeds a guidance scale "
                               "(guidance_embeds, FLUX.2-dev): pass guidance=[B] (e.g. 4.0)")
        if not cfg.guidance_embeds and guidance is not None:
            raise RequestError("guidance is given, but this model has no guidance embedding "
                               "(guidance_embeds=False, FLUX.2-klein): pass guidance=None")
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

    def __call__(self, hidden_states, encoder_hidden_states, timestep, img_ids, txt_ids,
                 guidance=None, text_mask=None):
        """The prediction ``[B, L, C_out]``; ``text_mask [B, T]`` (optional, True = token)
        masks text keys (diffusers' pipelines attend to every text token: None)."""
        h, ctx = self.embed(hidden_states, encoder_hidden_states, timestep, img_ids, txt_ids,
                            guidance, text_mask)
        return self.head(self.run_blocks(h, ctx), ctx)

    def embed(self, hidden_states, encoder_hidden_states, timestep, img_ids, txt_ids,
              guidance=None, text_mask=None) -> tuple[jax.Array, Embedded]:
        """Joint tokens ``h [B, S', D]`` (:class:`JointLayout`) and the blocks' context."""
        x, text = jnp.asarray(hidden_states), jnp.asarray(encoder_hidden_states)
        timestep = jnp.asarray(timestep)
        guidance = None if guidance is None else jnp.asarray(guidance)
        self.check_inputs(x, text, timestep, img_ids, txt_ids, guidance, text_mask)
        cfg, sharding = self.cfg, self.sharding
        dt = jnp.dtype(cfg.dtype)
        b, seq = x.shape[:2]
        layout = JointLayout(seq, text.shape[1], sharding.seq_shards)
        self._check_length_masks(layout, text_mask)

        # diffusers scales the [0, 1] timestep (and the guidance) by 1000 in the model dtype
        t = jnp.broadcast_to(timestep.astype(dt), (b,)) * 1000
        g = None if guidance is None else jnp.broadcast_to(guidance.astype(dt), (b,)) * 1000
        # The shared modulations are computed once, outside the blocks' loops: pinned to the
        # batch sharding (ROWS), so the partitioner gathers their fsdp-sharded kernels rather
        # than resharding the (small) activations with collective permutes at the program's
        # top level, which XLA:CPU may run beside a loop's collectives (a rendezvous deadlock).
        temb = sharding.constrain(self.time_guidance_embed(t, g, dt), ROWS)
        mod = tuple(sharding.constrain(m(temb), ROWS)
                    for m in (self.double_stream_modulation_img,
                              self.double_stream_modulation_txt, self.single_stream_modulation))

        x = sharding.constrain(x.astype(dt), ("act_batch", "act_seq", None))
        img = layout.pad(self.x_embedder(x), 1, image=True)
        txt = layout.pad(self.context_embedder(text.astype(dt)), 1, image=False)
        h = sharding.constrain(layout.join(img, txt), TOKENS)
        ids = layout.join(layout.pad(_ids(img_ids), 0, image=True),
                          layout.pad(_ids(txt_ids), 0, image=False), axis=0)
        cos, sin = (sharding.constrain(r, ("act_seq", None))
                    for r in rope_cos_sin(ids, cfg.axes_dims_rope, cfg.rope_theta))
        kv_mask = layout.key_mask(b, text_mask)
        return h, Embedded(temb=temb, mod=mod, rope=(cos, sin), kv_mask=kv_mask,
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
        mod_img, mod_txt, mod_single = ctx.mod
        run = dict(remat=cfg.remat, scan=cfg.scan_layers, prefetch=cfg.offload_prefetch)

        def double(streams, block):
            return block(streams, mod_img, mod_txt, ctx.rope, ctx.kv_mask, layout, attn,
                         sharding)

        def single(x, block):
            return block(x, mod_single, ctx.rope, ctx.kv_mask, attn, sharding)

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
        # diffusers' AdaLayerNormContinuous: scale first, then shift
        scale, shift = mod_terms(sharding.constrain(self.norm_out(ctx.temb), ROWS), 2)
        img = sharding.constrain(modulate(self.norm_out_ln, img, shift, scale), TOKENS)
        out = self.proj_out(img)
        return sharding.constrain(out, ("act_batch", "act_seq", "act_channels")).astype(ctx.dtype)


__all__ = ["Flux2Transformer", "Embedded"]
