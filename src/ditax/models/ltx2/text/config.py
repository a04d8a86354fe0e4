"""The configuration of LTX-2's text connectors (diffusers' ``LTX2TextConnectors``,
a pipeline's ``connectors/`` folder): the constructor arguments diffusers writes to its
``config.json``, checked before anything is built.

Two generations share the class:

- LTX-2.0 (``per_modality_projections=false``): every Gemma layer normalised per prompt and
  layer over its real tokens (masked mean / range × ``scale_factor``), one projection
  ``text_proj_in`` to ``caption_channels`` feeding both connectors (whose width must therefore
  be ``caption_channels``);
- LTX-2.3 (``true``): each (token, layer) RMS-normalised over the channels, then one
  projection per stream (``video_text_proj_in`` → ``video_hidden_dim``,
  ``audio_text_proj_in`` → ``audio_hidden_dim``), gated attention in the connectors.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ditax.errors import ConfigError, check_choice

ROPE_TYPES = ("interleaved", "split")


@dataclass(frozen=True)
class StreamConfig:
    """One connector (video or audio): ``heads`` × ``head_dim`` channels, ``layers`` blocks,
    ``registers`` learnable register tokens (None: padding is masked instead), ``gated``
    per-head output gates."""

    heads: int
    head_dim: int
    layers: int
    registers: int | None
    gated: bool

    @property
    def width(self) -> int:
        return self.heads * self.head_dim


@dataclass(frozen=True)
class LTX2ConnectorsConfig:
    """diffusers' ``LTX2TextConnectors`` arguments (its names and defaults: LTX-2.0 on
    Gemma-3 12B), plus ``dtype`` (storage and compute). ``causal_temporal_positioning`` is
    kept but unused, as in diffusers' forward."""

    caption_channels: int = 3840
    text_proj_in_factor: int = 49
    video_connector_num_attention_heads: int = 30
    video_connector_attention_head_dim: int = 128
    video_connector_num_layers: int = 2
    video_connector_num_learnable_registers: int | None = 128
    video_gated_attn: bool = False
    audio_connector_num_attention_heads: int = 30
    audio_connector_attention_head_dim: int = 128
    audio_connector_num_layers: int = 2
    audio_connector_num_learnable_registers: int | None = 128
    audio_gated_attn: bool = False
    connector_rope_base_seq_len: int = 4096
    rope_theta: float = 10000.0
    rope_double_precision: bool = True
    causal_temporal_positioning: bool = False
    rope_type: str = "interleaved"
    per_modality_projections: bool = False
    video_hidden_dim: int = 4096
    audio_hidden_dim: int = 2048
    proj_bias: bool = False
    dtype: str = "float32"

    @property
    def video(self) -> StreamConfig:
        return StreamConfig(self.video_connector_num_attention_heads,
                            self.video_connector_attention_head_dim,
                            self.video_connector_num_layers,
                            self.video_connector_num_learnable_registers, self.video_gated_attn)

    @property
    def audio(self) -> StreamConfig:
        return StreamConfig(self.audio_connector_num_attention_heads,
                            self.audio_connector_attention_head_dim,
                            self.audio_connector_num_layers,
                            self.audio_connector_num_learnable_registers, self.audio_gated_attn)

    @property
    def text_dim(self) -> int:
        """Width of the stacked Gemma hidden states the connectors take (``C · F``)."""
        return self.caption_channels * self.text_proj_in_factor

    @classmethod
    def from_diffusers(cls, raw: dict, dtype: str = "float32") -> "LTX2ConnectorsConfig":
        """From a ``connectors/config.json`` dict; an unknown ``_class_name`` is refused."""
        name = raw.get("_class_name")
        if name not in (None, "LTX2TextConnectors"):
            raise ConfigError(f"connectors config.json has _class_name={name!r}, not "
                              f"'LTX2TextConnectors'; point at an LTX-2 pipeline's connectors/")
        names = {f.name for f in dataclasses.fields(cls)} - {"dtype"}
        out = cls(**{k: raw[k] for k in names if k in raw}, dtype=dtype)
        out.check()
        return out

    def check(self) -> None:
        """Raise :class:`ConfigError` naming the value the connectors cannot be built with."""
        check_choice("connectors rope_type", self.rope_type, ROPE_TYPES)
        for key in ("caption_channels", "text_proj_in_factor", "connector_rope_base_seq_len"):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"connectors {key}={v!r}; expected a positive int")
        for which, s in (("video", self.video), ("audio", self.audio)):
            if s.heads < 1 or s.head_dim < 1 or s.layers < 0:
                raise ConfigError(f"connectors {which}: {s.heads} heads of {s.head_dim} and "
                                  f"{s.layers} layers; expected positive sizes")
            if s.registers is not None and s.registers < 1:
                raise ConfigError(f"connectors {which}_connector_num_learnable_registers="
                                  f"{s.registers!r}; expected a positive int or null")
            if s.head_dim % 2:
                raise ConfigError(f"connectors {which}: rotary pairs need an even head dim, "
                                  f"got {s.head_dim}")
            want = (getattr(self, f"{which}_hidden_dim") if self.per_modality_projections
                    else self.caption_channels)
            if s.width != want:
                what = (f"{which}_hidden_dim" if self.per_modality_projections
                        else "caption_channels")
                raise ConfigError(f"connectors {which}: {s.heads} heads × {s.head_dim} = "
                                  f"{s.width} channels, but the projection feeding it gives "
                                  f"{what}={want}; the config does not fit together")


__all__ = ["LTX2ConnectorsConfig", "StreamConfig", "ROPE_TYPES"]
