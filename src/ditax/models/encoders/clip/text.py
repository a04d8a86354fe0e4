"""CLIP text encoder (the ViT-L/14 text tower FLUX.1 takes its pooled vector from), in Flax NNX.

Numerically matches transformers' ``CLIPTextModel``: token + learned position embeddings,
pre-norm encoder layers under a causal mask (the layers of the vision tower,
:mod:`ditax.models.encoders.clip.encoder`, with a mask), a final LayerNorm, and the pooled output: the
final hidden state at the end-of-text token. Which token that is follows transformers' rule:

- ``eos_token_id == 2`` (configs written before transformers fixed the id, as
  openai/clip-vit-large-patch14's): the position of the largest input id (the end-of-text
  token has the largest id of the CLIP vocabulary);
- otherwise: the first position holding ``eos_token_id`` (position 0 where there is none).

Shapes: B batch, T text tokens, D ``hidden_size``, N heads, M ``intermediate_size``.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax.numpy as jnp
from flax import nnx

from ditax.errors import ConfigError, RequestError
from ditax.models.encoders.clip.encoder import (check_layer_shape, read_tower_config, run_layers,
                                       stack_layers)
from ditax.nn import FP32LayerNorm
from ditax.nn.offload import on_device

# transformers' CLIPTextConfig default, used when a config.json does not name the id
DEFAULT_EOS_TOKEN_ID = 49407


@dataclass(frozen=True)
class CLIPTextConfig:
    """Text tower shape, with transformers' ``CLIPTextConfig`` field names; the defaults are
    openai/clip-vit-large-patch14's (FLUX.1's ``text_encoder/``). ``dtype``: storage and
    compute dtype (norm statistics and softmax stay float32)."""

    vocab_size: int = 49408
    hidden_size: int = 768
    intermediate_size: int = 3072
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    max_position_embeddings: int = 77
    hidden_act: str = "quick_gelu"
    layer_norm_eps: float = 1e-5
    eos_token_id: int = 2
    dtype: str = "float32"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_hf(cls, cfg: dict, dtype: str = "float32") -> "CLIPTextConfig":
        """Build from a transformers ``config.json`` (a ``CLIPTextConfig``, or a full
        ``CLIPConfig`` whose ``text_config`` is used); refuses what cannot be built."""
        return read_tower_config(cls, cfg, "text_config", dtype,
                                 eos_token_id=DEFAULT_EOS_TOKEN_ID)

    def check(self) -> None:
        """Raise :class:`ConfigError` naming the value for a shape the encoder cannot take."""
        check_layer_shape(self)
        if isinstance(self.eos_token_id, bool) or not isinstance(self.eos_token_id, int):
            raise ConfigError(f"eos_token_id={self.eos_token_id!r}: the CLIP text encoder pools "
                              f"at one end-of-text id; give a single int")


class CLIPTextEmbeddings(nnx.Module):
    """ids ``[B, T]`` → ``token_embedding[ids] + position_embedding[:T]``, ``[B, T, D]``."""

    def __init__(self, cfg: CLIPTextConfig, rngs: nnx.Rngs):
        d, dt = cfg.hidden_size, jnp.dtype(cfg.dtype)
        init = nnx.initializers.normal(0.02)
        self.token_embedding = nnx.Param(init(rngs.params(), (cfg.vocab_size, d), dt))
        self.position_embedding = nnx.Param(init(rngs.params(),
                                                 (cfg.max_position_embeddings, d), dt))

    def __call__(self, input_ids):
        t = input_ids.shape[1]
        pos = self.position_embedding[...]
        if t > pos.shape[0]:
            raise RequestError(f"{t} text tokens, more than max_position_embeddings="
                               f"{pos.shape[0]} of this CLIP text encoder; tokenize with "
                               f"max_length <= {pos.shape[0]}")
        return jnp.take(self.token_embedding[...], input_ids, axis=0) + pos[:t][None]


class CLIPTextEncoder(nnx.Module):
    """CLIP text tower: ``input_ids [B, T]`` (+ optional padding mask ``[B, T]``) →
    ``(last_hidden_state [B, T, D], pooler_output [B, D])``.

    Every query sees the keys at or before it (causal), and with ``attention_mask`` only the
    unpadded ones (right padding; FLUX.1 passes no mask: padding is after the end token, which
    the causal mask already hides from every real token).
    """

    def __init__(self, cfg: CLIPTextConfig, *, rngs: nnx.Rngs):
        cfg.check()
        self.cfg = cfg
        self.embeddings = CLIPTextEmbeddings(cfg, rngs)
        self.layers = stack_layers(cfg, rngs)
        self.final_layer_norm = FP32LayerNorm(cfg.hidden_size, cfg.layer_norm_eps, affine=True,
                                              param_dtype=jnp.dtype(cfg.dtype))

    @on_device     # weights kept in host memory (text_offload): on the device for the call
    def __call__(self, input_ids, attention_mask=None):
        ids = jnp.asarray(input_ids)
        if ids.ndim != 2:
            raise RequestError(f"input_ids must be [B, T]; got shape {ids.shape}")
        b, t = ids.shape
        mask = jnp.tril(jnp.ones((t, t), bool))[None, None]           # [1, 1, T, T]
        if attention_mask is not None:
            attention_mask = jnp.asarray(attention_mask)
            if attention_mask.shape != (b, t):
                raise RequestError(f"attention_mask shape {attention_mask.shape} != input_ids "
                                   f"shape {(b, t)}")
            mask = mask & (attention_mask > 0)[:, None, None, :]
        mask = jnp.broadcast_to(mask, (b, 1, t, t))
        h = self.embeddings(ids).astype(jnp.dtype(self.cfg.dtype))
        h = run_layers(self.layers, h, self.cfg.num_hidden_layers, mask)
        h = self.final_layer_norm(h).astype(h.dtype)
        return h, h[jnp.arange(b), self.eos_positions(ids)]

    def eos_positions(self, ids):
        """``[B]`` int: where each row's pooled state is read (transformers' rule, above)."""
        if self.cfg.eos_token_id == 2:
            return jnp.argmax(ids, axis=-1)
        return jnp.argmax((ids == self.cfg.eos_token_id).astype(jnp.int32), axis=-1)

    def pooled(self, input_ids, attention_mask=None):
        """``[B, D]``: the ``pooler_output`` (what FLUX.1 conditions on)."""
        return self(input_ids, attention_mask)[1]


__all__ = ["CLIPTextConfig", "CLIPTextEncoder", "CLIPTextEmbeddings", "DEFAULT_EOS_TOKEN_ID"]
