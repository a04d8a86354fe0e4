"""FLUX.2 transformer in Flax NNX (diffusers ``Flux2Transformer2DModel``).

``model(hidden_states [B, L, C_in], encoder_hidden_states [B, T, Dt], timestep [B] in [0, 1],
img_ids [L, 4] | [B, L, 4], txt_ids [T, 4] | [B, T, 4], guidance [B] | None) → [B, L, C_out]``
— diffusers' own argument order (3-D ids: the first row is used, as diffusers does); packed
image tokens in and out. Reference-image tokens of image-conditioned sampling are more image
tokens with their own ids (the pipeline appends them and drops their outputs).

Inside: the time (+ guidance) embedding, three shared modulations of it (image and text
stream of the double blocks, the single blocks), ``num_layers`` double-stream blocks on
(image, text), then ``num_single_layers`` single-stream blocks on the joint sequence: the
frame FLUX.1 shares (:class:`~ditax.models.common.bfl.transformer.JointDiT`: the joint layout,
the stacks, the head).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.attention.config import AttentionConfig
from ditax.models.common.bfl.blocks import TOKENS, modulate
from ditax.models.common.bfl.transformer import Embedded, JointDiT
from ditax.models.flux2.blocks import DoubleBlock, SingleBlock
from ditax.models.flux2.config import Flux2Config
from ditax.models.flux2.embeddings import (Modulation, TimeGuidanceEmbed, mod_terms,
                                           rope_cos_sin)
from ditax.nn import FP32LayerNorm, Linear
from ditax.nn.stack import make_stack

#: a per-sample vector ``[B, ·]`` (the time embedding, the modulations): split over the batch
ROWS = ("act_batch", None)


class Flux2Transformer(JointDiT):
    """FLUX.2 DiT (see the module docstring for the call).

    Args:
      cfg: model shape and numerics; checked by the entry points
        (:func:`ditax.models.flux2.config.check_transformer`), not here.
      attention: attention backend / options (an :class:`AttentionConfig` or a backend name).
      mesh: optional device mesh; activations are constrained by the logical rules.
    """

    GUIDED, UNGUIDED, GUIDANCE = "FLUX.2-dev", "FLUX.2-klein", 4.0
    IDS_3D = True

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

    def check_inputs(self, hidden_states, encoder_hidden_states, timestep, img_ids, txt_ids,
                     guidance=None, text_mask=None):
        """Raise :class:`~ditax.errors.RequestError` naming the shapes for inputs the model
        cannot take."""
        self.check_joint_inputs(hidden_states, encoder_hidden_states, timestep, img_ids,
                                txt_ids, guidance, text_mask)

    def __call__(self, hidden_states, encoder_hidden_states, timestep, img_ids, txt_ids,
                 guidance=None, text_mask=None):
        """The prediction ``[B, L, C_out]``; ``text_mask [B, T]`` (optional, True = token)
        masks text keys (diffusers' pipelines attend to every text token: None)."""
        h, ctx = self.embed(hidden_states, encoder_hidden_states, timestep, img_ids, txt_ids,
                            guidance, text_mask)
        return self.head(self.run_blocks(h, ctx), ctx)

    def embed(self, hidden_states, encoder_hidden_states, timestep, img_ids, txt_ids,
              guidance=None, text_mask=None) -> tuple[jax.Array, Embedded]:
        """Joint tokens ``h [B, S', D]`` and the blocks' context
        (:meth:`~ditax.models.common.bfl.transformer.JointDiT.joint_embed`)."""
        x, text = jnp.asarray(hidden_states), jnp.asarray(encoder_hidden_states)
        timestep = jnp.asarray(timestep)
        guidance = None if guidance is None else jnp.asarray(guidance)
        self.check_inputs(x, text, timestep, img_ids, txt_ids, guidance, text_mask)
        return self.joint_embed(x, text, timestep, img_ids, txt_ids, guidance, text_mask,
                                self._conditioning)

    def _conditioning(self, t, g, dt):
        """``temb`` and the three shared modulations, computed once, outside the blocks'
        loops: pinned to the batch sharding (ROWS), so the partitioner gathers their
        fsdp-sharded kernels rather than resharding the (small) activations with collective
        permutes at the program's top level, which XLA:CPU may run beside a loop's collectives
        (a rendezvous deadlock)."""
        sharding = self.sharding
        temb = sharding.constrain(self.time_guidance_embed(t, g, dt), ROWS)
        mod = tuple(sharding.constrain(m(temb), ROWS)
                    for m in (self.double_stream_modulation_img,
                              self.double_stream_modulation_txt, self.single_stream_modulation))
        return temb, mod

    def rope(self, ids):
        return rope_cos_sin(ids, self.cfg.axes_dims_rope, self.cfg.rope_theta)

    def block_modulation(self, ctx: Embedded) -> tuple[tuple, tuple]:
        """The double blocks read the image and text modulations, the single blocks theirs."""
        mod_img, mod_txt, mod_single = ctx.mod
        return (mod_img, mod_txt), (mod_single,)

    def output_norm(self, img, ctx: Embedded):
        # diffusers' AdaLayerNormContinuous: scale first, then shift
        sharding = self.sharding
        scale, shift = mod_terms(sharding.constrain(self.norm_out(ctx.temb), ROWS), 2)
        return sharding.constrain(modulate(self.norm_out_ln, img, shift, scale), TOKENS)


__all__ = ["Flux2Transformer", "Embedded"]
