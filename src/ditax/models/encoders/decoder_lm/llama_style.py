"""The ``config.json`` reading that the Llama-style decoder LMs (Qwen3, Mistral) share: plain
``w·x̂`` RMS norms, unscaled embeddings, the SiLU-gated MLP, one rotary embedding for every
layer, grouped-query attention.

Both transformers config generations are read: ``rope_parameters`` (transformers 5:
``{"rope_type": ..., "rope_theta": ...}``) and ``rope_theta`` + ``rope_scaling`` (earlier).
The rotary kinds the floor computes are ``default`` and ``linear``; any other
(``yarn``, ``llama3``, ``dynamic``, ``longrope``…) is refused in one line naming it — the
checkpoints FLUX.2 ships (Qwen3 4B / 8B: theta 1e6; Mistral Small 3.1: theta 1e9) use none.
"""

from __future__ import annotations

from ditax.errors import ConfigError
from ditax.models.encoders.decoder_lm.config import FULL, ROPE_TYPES, DecoderLMConfig, Rope


def rope_of(text: dict, default_theta: float, who: str) -> Rope:
    """The one rotary embedding of a Llama-style text config (either generation)."""
    params = text.get("rope_parameters")
    if isinstance(params, dict) and FULL in params:     # per-layer-kind form: one kind here
        params = params[FULL]
    params = dict(params or text.get("rope_scaling") or {})
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise ConfigError(f"{who} config: rope_type={kind!r} is not supported (ditax computes "
                          f"{' / '.join(ROPE_TYPES)} rotary embeddings); use a checkpoint "
                          f"without {kind!r} rope scaling")
    theta = params.get("rope_theta", text.get("rope_theta", default_theta))
    try:
        return Rope(theta=float(theta), kind=kind, factor=float(params.get("factor", 1.0)))
    except (TypeError, ValueError):
        raise ConfigError(f"{who} config: rope_theta={theta!r} / factor="
                          f"{params.get('factor')!r} are not numbers") from None


def llama_style_config(t: dict, *, name: str, qk_norm: bool, layer_types, sliding_window,
                       rope: Rope, dtype: str) -> DecoderLMConfig:
    """The floor's config of a Llama-style text config ``t`` (defaults already filled in):
    head_dim, when absent or null, is ``hidden_size / num_attention_heads`` as transformers
    takes it. Checked before it is returned."""
    heads = t["num_attention_heads"]
    head_dim = t.get("head_dim")
    if head_dim is None and isinstance(heads, int) and heads > 0:
        head_dim = t["hidden_size"] // heads
    kv = t.get("num_key_value_heads")
    cfg = DecoderLMConfig(
        vocab_size=t["vocab_size"], hidden_size=t["hidden_size"],
        intermediate_size=t["intermediate_size"], num_layers=t["num_hidden_layers"],
        num_heads=heads, num_kv_heads=heads if kv is None else kv, head_dim=head_dim,
        layer_types=tuple(layer_types), rope_full=rope,
        rope_sliding=rope if sliding_window is not None else None,
        sliding_window=sliding_window, rms_norm_eps=float(t["rms_norm_eps"]), norm="llama",
        embed_scale=False, qk_norm=qk_norm, sandwich_norm=False,
        attention_bias=bool(t.get("attention_bias", False)), activation=t["hidden_act"],
        dtype=dtype, name=name)
    cfg.check()
    return cfg


def quant_mode(quantize) -> str:
    """``None`` (the FLUX.2 callers' "no quantization") as the floor's ``"none"``."""
    return "none" if quantize is None else quantize


__all__ = ["rope_of", "llama_style_config", "quant_mode"]
