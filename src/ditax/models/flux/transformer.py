"""FLUX.1 transformer in Flax NNX (diffusers ``FluxTransformer2DModel``).

``model(hidden_states [B, L, C_in], timestep [B] in [0, 1], encoder_hidden_states [B, T, Dt],
pooled_projections=[B, Dp], img_ids=[L, n], txt_ids=[T, n], guidance=[B] | None) →
[B, L, C_out]`` — packed image tokens in and out, as diffusers; the arguments in the order of
the family protocol (:class:`ditax.models.base.Denoiser`: input, timestep, text, then the
family's extras as keywords). ``ditax.load_transformer`` returns a callable in diffusers'
own order (:class:`ditax.models.flux.loading.FluxTransformerModel`).

Inside, ``num_layers`` double-stream blocks run on (image, text) and then
``num_single_layers`` single-stream blocks on the joint sequence: the frame FLUX.2 shares
(:class:`~ditax.models.common.bfl.transformer.JointDiT`: the joint layout, the stacks, the
head). FLUX.1's own: the time + pooled-text (+ guidance) embedding ``temb`` that every block
modulates with through its own adaLN layers, and RoPE with theta 10000.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.attention.config import AttentionConfig
from ditax.errors import RequestError
from ditax.models.common.bfl.transformer import Embedded, JointDiT
from ditax.models.flux.blocks import AdaNorm, DoubleBlock, SingleBlock
from ditax.models.flux.config import FluxConfig
from ditax.models.flux.embeddings import TimeTextEmbed, rope_cos_sin
from ditax.nn import Linear
from ditax.nn.stack import make_stack


class FluxTransformer(JointDiT):
    """Flux DiT (see the module docstring for the call).

    Args:
      cfg: model shape and numerics (dtypes, remat, layer scan); checked by the entry points
        (:func:`ditax.models.flux.config.check_transformer`), not here.
      attention: attention backend / options (an :class:`AttentionConfig` or a backend name).
      mesh: optional device mesh; activations are constrained by the logical rules.
    """

    GUIDED, UNGUIDED, GUIDANCE = "FLUX.1-dev", "FLUX.1-schnell", 3.5

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

    def check_inputs(self, hidden_states, timestep, encoder_hidden_states, *, pooled_projections,
                     img_ids, txt_ids, guidance=None, text_mask=None):
        """Raise :class:`~ditax.errors.RequestError` naming the shapes for inputs the model
        cannot take."""
        dp = self.cfg.pooled_projection_dim

        def pooled(b):
            p = pooled_projections
            if p is None or tuple(p.shape) != (b, dp):
                raise RequestError(f"pooled_projections must be [B={b}, pooled_projection_dim="
                                   f"{dp}]; got {None if p is None else tuple(p.shape)}")

        self.check_joint_inputs(hidden_states, encoder_hidden_states, timestep, img_ids,
                                txt_ids, guidance, text_mask, pooled)

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
        """Joint tokens ``h [B, S', D]`` and the blocks' context
        (:meth:`~ditax.models.common.bfl.transformer.JointDiT.joint_embed`)."""
        x, text = jnp.asarray(hidden_states), jnp.asarray(encoder_hidden_states)
        timestep = jnp.asarray(timestep)
        guidance = None if guidance is None else jnp.asarray(guidance)
        self.check_inputs(x, timestep, text, pooled_projections=pooled_projections,
                          img_ids=img_ids, txt_ids=txt_ids, guidance=guidance,
                          text_mask=text_mask)

        def conditioning(t, g, dt):
            temb = self.time_text_embed(t, jnp.asarray(pooled_projections).astype(dt), g)
            return temb, temb

        return self.joint_embed(x, text, timestep, img_ids, txt_ids, guidance, text_mask,
                                conditioning)

    def rope(self, ids):
        return rope_cos_sin(ids, self.cfg.axes_dims_rope)

    def block_modulation(self, ctx: Embedded) -> tuple[tuple, tuple]:
        """Every block modulates with ``temb`` through its own adaLN layers."""
        return (ctx.temb,), (ctx.temb,)

    def output_norm(self, img, ctx: Embedded):
        scale, shift = self.norm_out.terms(ctx.temb)     # AdaLayerNormContinuous: scale first
        return self.norm_out.modulate(img, shift, scale)


__all__ = ["FluxTransformer", "Embedded"]
