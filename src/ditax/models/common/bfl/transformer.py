"""The frame of FLUX.1's and FLUX.2's transformers (:class:`JointDiT`): packed image tokens
and text embedded into one joint sequence, ``num_layers`` double-stream blocks on (image,
text), ``num_single_layers`` single-stream blocks on the joint sequence, and the output head
on the image tokens. What differs — the time / guidance conditioning, the modulation each
block kind reads, the RoPE table, the output norm, the inputs' rules beyond the shared ones —
is the family's (:mod:`ditax.models.flux.transformer`, :mod:`ditax.models.flux2.transformer`).

The joint sequence is laid out by :class:`~ditax.models.common.joint_layout.JointLayout`: on
``c`` context shards each stream is padded to a multiple of ``c`` and placed shard-major, so
joining and splitting the streams moves nothing between devices and ``ulysses`` / ``ring`` /
``ulysses_ring`` see one evenly split sequence; pad tokens are masked as keys. Each stack is
one module with a leading layer axis, run scanned and under the configured remat policy
(:mod:`ditax.nn.stack`). Attention runs through one :class:`~ditax.attention.AttentionPlan`
(``self_attn``: every block's attention is joint self-attention).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from ditax.attention import registry
from ditax.attention.sequence.plan import ring_ulysses
from ditax.errors import RequestError
from ditax.models.common.bfl.blocks import TOKENS
from ditax.models.common.dit import DiT
from ditax.models.common.joint_layout import JointLayout, check_length_masks
from ditax.nn.stack import run_stack


class Embedded(NamedTuple):
    """What :meth:`JointDiT.embed` hands the blocks and the head: ``temb [B, D]`` (the
    conditioning), ``mod`` (the family's modulation of it: FLUX.1 ``temb`` itself, FLUX.2 the
    image, text and single modulations ``[B, 6D], [B, 6D], [B, 3D]`` float32), rope (cos, sin)
    ``[S', K]`` and ``kv_mask [B, S']`` (or None) of the joint ``layout``, the output dtype,
    and ``seq``: the joint tokens ``S'`` (pad tokens included when the layout pads)."""

    temb: jax.Array
    mod: Any
    rope: tuple
    kv_mask: Any
    layout: JointLayout
    dtype: Any
    seq: int


def position_ids(ids):
    """Position ids as ``[S, n]`` float32: diffusers' 3-D ids ``[B, S, n]`` give their first
    row (diffusers uses ``ids[0]``)."""
    ids = jnp.asarray(ids, jnp.float32)
    return ids[0] if ids.ndim == 3 else ids


class JointDiT(DiT):
    """A BFL dual-stream DiT. The family's module owns ``x_embedder``, ``context_embedder``,
    ``transformer_blocks``, ``single_transformer_blocks`` and ``proj_out``, and gives:

    - ``GUIDED`` / ``UNGUIDED``: the model names with and without a guidance embedding, and
      ``GUIDANCE``: a typical guidance scale (the inputs' messages);
    - ``IDS_3D``: whether 3-D position ids ``[B, S, n]`` are taken (their first row used);
    - :meth:`rope` (``ids [S', n]`` → cos, sin ``[S', K]``), :meth:`block_modulation` (the
      arguments the double and the single blocks take before the rope) and :meth:`output_norm`
      (the modulated norm of the image tokens before ``proj_out``).
    """

    GUIDED: str
    UNGUIDED: str
    GUIDANCE: float
    IDS_3D: bool = False

    @property
    def block_stacks(self) -> tuple[tuple[str, int], ...]:
        """Double-stream blocks, then single-stream blocks
        (:class:`~ditax.models.base.Denoiser`)."""
        return (("transformer_blocks", self.cfg.num_layers),
                ("single_transformer_blocks", self.cfg.num_single_layers))

    # -- the family's parts ---------------------------------------------------------------------

    def rope(self, ids):
        raise NotImplementedError

    def block_modulation(self, ctx: Embedded) -> tuple[tuple, tuple]:
        raise NotImplementedError

    def output_norm(self, img, ctx: Embedded):
        raise NotImplementedError

    # -- inputs ---------------------------------------------------------------------------------

    def _ids_rule(self, name, ids, n, n_axes) -> None:
        shape = None if ids is None else tuple(ids.shape)
        if self.IDS_3D:
            if shape is None or shape[-2:] != (n, n_axes) or len(shape) not in (2, 3):
                raise RequestError(f"{name} must be [{n}, {n_axes}] or [B, {n}, {n_axes}] (one "
                                   f"position per token and rope axis); got {shape}")
        elif shape != (n, n_axes):
            raise RequestError(f"{name} must be [{n}, {n_axes}] (one position per token and "
                               f"rope axis; diffusers' 3-D ids: pass ids[0]); got {shape}")

    def check_joint_inputs(self, x, text, timestep, img_ids, txt_ids, guidance=None,
                           text_mask=None, pooled: Callable | None = None) -> None:
        """Raise :class:`~ditax.errors.RequestError` naming the shapes for inputs the model
        cannot take (``pooled(b)``: the family's check of its pooled text, after the text's)."""
        cfg = self.cfg
        n_axes = len(cfg.axes_dims_rope)
        if x.ndim != 3 or x.shape[-1] != cfg.in_channels:
            raise RequestError(f"hidden_states must be packed tokens [B, L, in_channels="
                               f"{cfg.in_channels}]; got shape {tuple(x.shape)}")
        b, seq = x.shape[:2]
        if text.ndim != 3 or text.shape[0] != b or text.shape[-1] != cfg.joint_attention_dim:
            raise RequestError(f"encoder_hidden_states must be [B={b}, T, joint_attention_dim="
                               f"{cfg.joint_attention_dim}]; got shape {tuple(text.shape)}")
        if pooled is not None:
            pooled(b)
        self._ids_rule("img_ids", img_ids, seq, n_axes)
        self._ids_rule("txt_ids", txt_ids, text.shape[1], n_axes)
        for name, v in (("timestep", timestep), ("guidance", guidance)):
            if v is not None and (v.ndim > 1 or (v.ndim == 1 and v.shape[0] not in (1, b))):
                raise RequestError(f"{name} must be a scalar or [B={b}]; got shape "
                                   f"{tuple(v.shape)}")
        if cfg.guidance_embeds and guidance is None:
            raise RequestError(f"guidance=None, but this model embeds a guidance scale "
                               f"(guidance_embeds, {self.GUIDED}): pass guidance=[B] (e.g. "
                               f"{self.GUIDANCE})")
        if not cfg.guidance_embeds and guidance is not None:
            raise RequestError(f"guidance is given, but this model has no guidance embedding "
                               f"(guidance_embeds=False, {self.UNGUIDED}): pass guidance=None")
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

    # -- the three steps ------------------------------------------------------------------------

    def joint_embed(self, x, text, timestep, img_ids, txt_ids, guidance, text_mask,
                    conditioning: Callable) -> tuple[jax.Array, Embedded]:
        """Joint tokens ``h [B, S', D]`` (:class:`JointLayout`) and the blocks' context, of
        checked arrays ``x [B, L, C_in]`` and ``text [B, T, Dt]``; ``conditioning(t, g, dt)``
        → ``(temb, mod)`` of the timestep and guidance (each ``[B]``, scaled by 1000 in the
        model dtype ``dt``, as diffusers scales them)."""
        cfg, sharding = self.cfg, self.sharding
        dt = jnp.dtype(cfg.dtype)
        b, seq = x.shape[:2]
        layout = JointLayout(seq, text.shape[1], sharding.seq_shards)
        self._check_length_masks(layout, text_mask)

        t = jnp.broadcast_to(timestep.astype(dt), (b,)) * 1000
        g = None if guidance is None else jnp.broadcast_to(guidance.astype(dt), (b,)) * 1000
        temb, mod = conditioning(t, g, dt)

        h_img = sharding.constrain(x.astype(dt), ("act_batch", "act_seq", None))
        img = layout.pad(self.x_embedder(h_img), 1, image=True)
        txt = layout.pad(self.context_embedder(text.astype(dt)), 1, image=False)
        h = sharding.constrain(layout.join(img, txt), TOKENS)
        ids = layout.join(layout.pad(position_ids(img_ids), 0, image=True),
                          layout.pad(position_ids(txt_ids), 0, image=False), axis=0)
        cos, sin = (sharding.constrain(r, ("act_seq", None)) for r in self.rope(ids))
        kv_mask = layout.key_mask(b, text_mask)
        return h, Embedded(temb=temb, mod=mod, rope=(cos, sin), kv_mask=kv_mask,
                           layout=layout, dtype=x.dtype, seq=layout.length)

    def run_blocks(self, h, ctx: Embedded, start: int = 0, stop: int | None = None):
        """Blocks ``start .. stop-1`` (default all; numbered double blocks first, then single
        blocks) on the joint tokens ``h [B, S', D]``."""
        cfg = self.cfg
        nd, ns = cfg.num_layers, cfg.num_single_layers
        stop = nd + ns if stop is None else stop
        if not 0 <= start <= stop <= nd + ns:
            raise ValueError(f"blocks {start}..{stop} outside 0..{nd + ns}")
        attn, sharding, layout = self.attention_plan.self_attn, self.sharding, ctx.layout
        mod_double, mod_single = self.block_modulation(ctx)
        run = dict(remat=cfg.remat, scan=cfg.scan_layers, prefetch=cfg.offload_prefetch)

        def double(streams, block):
            return block(streams, *mod_double, ctx.rope, ctx.kv_mask, layout, attn, sharding)

        def single(x, block):
            return block(x, *mod_single, ctx.rope, ctx.kv_mask, attn, sharding)

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
        out = self.proj_out(self.output_norm(img, ctx))
        return sharding.constrain(out, ("act_batch", "act_seq", "act_channels")).astype(ctx.dtype)


__all__ = ["Embedded", "JointDiT", "position_ids"]
