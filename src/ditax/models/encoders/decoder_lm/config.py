"""The decoder-LM floor's configuration: one frozen dataclass whose switches are the ways
Gemma-3, Qwen3 and Mistral differ, checked before anything is built.

A family module (:mod:`.gemma3`, :mod:`.qwen3`, :mod:`.mistral`) reads its transformers
``config.json`` into a :class:`DecoderLMConfig`; the model (:mod:`.model`) and the weight
table (:mod:`.convert`) read only this class.
"""

from __future__ import annotations

from dataclasses import dataclass

from ditax.errors import ConfigError, check_choice
from ditax.models.encoders.inputs import compute_dtype
from ditax.nn.activations import ACTIVATIONS

FULL, SLIDING = "full_attention", "sliding_attention"   # transformers' layer_types values
LAYER_KINDS = (FULL, SLIDING)
NORMS = ("gemma", "llama")
ROPE_TYPES = ("default", "linear")


@dataclass(frozen=True)
class Rope:
    """Rotary embedding of one layer kind: ``theta`` (transformers' ``rope_theta``), ``kind``
    (``default``, or ``linear``: every frequency divided by ``factor``, Gemma-3 12B's global
    layers)."""

    theta: float = 10_000.0
    kind: str = "default"
    factor: float = 1.0

    def check(self, where: str) -> None:
        check_choice(f"{where} rope_type", self.kind, ROPE_TYPES)
        if not self.theta > 0 or not self.factor > 0:
            raise ConfigError(f"{where}: rope_theta={self.theta!r} and factor={self.factor!r} "
                              f"must be positive")


@dataclass(frozen=True)
class DecoderLMConfig:
    """A decoder-only LM's text stack (no LM head). Field names follow transformers where
    they have one.

    Switches (Gemma-3 / Qwen3 / Mistral):

    - ``norm``: ``"gemma"`` — RMS norm ``x̂·(1 + w)`` with the product in float32 (weights
      stored zero-centred) / ``"llama"`` — ``w·x̂`` with ``x̂`` rounded to the compute dtype
      first (Qwen3, Mistral);
    - ``embed_scale``: multiply the embeddings by ``sqrt(hidden_size)`` rounded to the dtype
      (Gemma) / not;
    - ``qk_norm``: RMS-norm each query and key head over ``head_dim`` before the rotation
      (Gemma-3, Qwen3) / not (Mistral);
    - ``sandwich_norm``: norms after attention and after the MLP too (Gemma 2/3) / only the two
      pre-norms;
    - ``query_scale``: the logits' scale, None = ``head_dim**-0.5`` (Gemma-3:
      ``query_pre_attn_scalar**-0.5``);
    - ``attn_softcap``: ``c·tanh(logits / c)`` before the mask (Gemma 2) / None;
    - ``layer_types``: per layer ``"full_attention"`` or ``"sliding_attention"`` (keys within
      ``sliding_window`` positions of the query); ``rope_full`` / ``rope_sliding`` the rotary
      embedding of each kind (Gemma-3: 1e6 linear ×8 global, 1e4 local);
    - ``num_kv_heads`` < ``num_heads``: grouped-query attention; ``attention_bias``: biases on
      q/k/v/o (Qwen2) / none; ``activation``: the gated MLP's (``gelu_pytorch_tanh``, ``silu``).

    ``dtype``: storage and compute dtype (norm statistics and softmax stay float32);
    ``name``: the model named in messages.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    layer_types: tuple[str, ...]
    rope_full: Rope = Rope()
    rope_sliding: Rope | None = None
    sliding_window: int | None = None
    rms_norm_eps: float = 1e-6
    norm: str = "llama"
    embed_scale: bool = False
    qk_norm: bool = False
    sandwich_norm: bool = False
    query_scale: float | None = None
    attn_softcap: float | None = None
    attention_bias: bool = False
    activation: str = "silu"
    dtype: str = "float32"
    name: str = "decoder LM"

    @property
    def scale(self) -> float:
        """The attention logits' scale."""
        return self.head_dim ** -0.5 if self.query_scale is None else self.query_scale

    @property
    def kind_index(self) -> tuple[int, ...]:
        """Per layer 0 (full) or 1 (sliding): the index of its mask and rotary table."""
        return tuple(LAYER_KINDS.index(k) for k in self.layer_types)

    def check(self) -> None:
        """Raise :class:`ConfigError` naming the value the model cannot be built with."""
        who = f"{self.name} config"
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                    "num_kv_heads", "head_dim"):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"{who}: {key}={v!r}; expected a positive int")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"{who}: num_attention_heads={self.num_heads} is not a multiple "
                              f"of num_key_value_heads={self.num_kv_heads}")
        if self.head_dim % 2:
            raise ConfigError(f"{who}: head_dim={self.head_dim} must be even (rotary pairs)")
        if len(self.layer_types) != self.num_layers:
            raise ConfigError(f"{who}: {len(self.layer_types)} layer_types for "
                              f"num_hidden_layers={self.num_layers}; give one per layer")
        for k in self.layer_types:
            check_choice(f"{who} layer_types entry", k, LAYER_KINDS)
        if SLIDING in self.layer_types:
            if not isinstance(self.sliding_window, int) or self.sliding_window < 1:
                raise ConfigError(f"{who}: sliding layers need a positive sliding_window, got "
                                  f"{self.sliding_window!r}")
            if self.rope_sliding is None:
                raise ConfigError(f"{who}: sliding layers need their rotary embedding "
                                  f"(rope_sliding)")
            self.rope_sliding.check(f"{who} sliding_attention")
        self.rope_full.check(f"{who} full_attention")
        check_choice(f"{who} norm", self.norm, NORMS)
        if self.activation not in ACTIVATIONS:
            raise ConfigError(f"{who}: activation {self.activation!r} is not supported; "
                              f"supported: {sorted(ACTIVATIONS)}")
        if self.attn_softcap is not None and not self.attn_softcap > 0:
            raise ConfigError(f"{who}: attn_logit_softcapping={self.attn_softcap!r} must be "
                              f"positive or null")
        compute_dtype(self.dtype)


__all__ = ["DecoderLMConfig", "Rope", "FULL", "SLIDING", "LAYER_KINDS", "compute_dtype"]
