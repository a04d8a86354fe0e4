"""Mistral's text model on the decoder-LM floor (FLUX.2 dev's text encoder: the language
model of Mistral Small 3.1's ``Mistral3ForConditionalGeneration``): its config read into a
:class:`~ditax.models.encoders.decoder_lm.config.DecoderLMConfig`, and its loader.

Mistral is Llama-shaped (:mod:`.llama_style`), no q/k norms, ``head_dim`` its own field
(Mistral Small: 128 with ``hidden_size`` 5120 and 32 heads). A non-null ``sliding_window``
makes every layer a sliding-window layer (transformers' Mistral masks all layers alike);
Mistral Small 3.x sets it null, rope theta 1e9, no rope scaling.

A folder may hold the multimodal ``Mistral3ForConditionalGeneration`` (``config.json`` with a
``text_config``; transformers writes the text stack under ``language_model.model.``, the
in-memory names are ``model.language_model.``; the Pixtral ``vision_tower``, the
``multi_modal_projector`` and the LM head are recognised and not read) or a text-only
``MistralForCausalLM`` / ``MistralModel``.
"""

from __future__ import annotations

from ditax.errors import ConfigError
from ditax.io.files import read_model_json
from ditax.io.hub import resolve_folder
from ditax.io.weights import Weights
from ditax.models.encoders.decoder_lm.config import FULL, SLIDING, DecoderLMConfig
from ditax.models.encoders.decoder_lm.convert import load_decoder_lm
from ditax.models.encoders.decoder_lm.llama_style import llama_style_config, quant_mode, rope_of

# transformers' MistralConfig defaults (what a config.json may leave out)
DEFAULTS = dict(vocab_size=32_000, hidden_size=4096, intermediate_size=14_336,
                num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                head_dim=None, hidden_act="silu", rms_norm_eps=1e-6, sliding_window=4096)
DEFAULT_THETA = 10_000.0

# Mistral3Config's text_config when the file gives none (Mistral Small 3.1)
MISTRAL3_TEXT = dict(head_dim=128, hidden_act="silu", hidden_size=5120,
                     intermediate_size=32_768, model_type="mistral", num_attention_heads=32,
                     num_hidden_layers=40, num_key_value_heads=8, rms_norm_eps=1e-5,
                     rope_theta=1e9, sliding_window=None, vocab_size=131_072)

# the multimodal checkpoint's other parts and the LM head: present, never read
IGNORE = (r"^(model\.)?vision_tower\.", r"^(model\.)?multi_modal_projector\.",
          r"^(language_model\.)?lm_head\.")


def text_config(raw: dict) -> dict:
    """The text model's part of a Mistral-3 / Mistral ``config.json``; a
    :class:`ConfigError` for another model type."""
    model_type = raw.get("model_type")
    if model_type == "mistral3" or "text_config" in raw:
        text = raw.get("text_config")
        text = dict(MISTRAL3_TEXT) if text is None else text
    elif model_type in (None, "mistral"):
        text = raw
    else:
        raise ConfigError(f"config.json has model_type={model_type!r}, not Mistral "
                          f"('mistral3' or 'mistral'); point at a Mistral text encoder "
                          f"(FLUX.2 dev's text_encoder/)")
    if text.get("model_type") not in (None, "mistral"):
        raise ConfigError(f"config.json text_config has model_type={text['model_type']!r}, "
                          f"not 'mistral'")
    return text


def mistral_config(raw: dict, dtype: str = "float32") -> DecoderLMConfig:
    """A ``Mistral3ForConditionalGeneration`` or ``MistralForCausalLM`` ``config.json`` dict
    → the floor's config of its text model."""
    text = text_config(raw)
    t = {**DEFAULTS, **{k: v for k, v in text.items()
                        if v is not None or k in ("head_dim", "sliding_window")}}
    if text.get("layer_types"):
        raise ConfigError("the Mistral config has layer_types (alternating attention, a "
                          "Ministral model); ditax's Mistral text encoder has one attention "
                          "kind for every layer")
    window = t["sliding_window"]
    n = t["num_hidden_layers"]
    layer_types = [SLIDING if window is not None else FULL] * (n if isinstance(n, int) else 0)
    return llama_style_config(t, name="Mistral", qk_norm=False, layer_types=layer_types,
                              sliding_window=window, rope=rope_of(t, DEFAULT_THETA, "Mistral"),
                              dtype=dtype)


def load_mistral3_text(path, quantize=None, *, dtype: str = "float32",
                       quantize_activations: bool = False, mesh=None,
                       subfolder: str = "text_encoder"):
    """Load the Mistral text model from a transformers folder (``Mistral3ForConditional
    Generation`` or ``MistralForCausalLM``) or a pipeline folder's ``subfolder/`` (FLUX.2
    dev: ``text_encoder/``) → a :class:`~ditax.models.encoders.decoder_lm.model.DecoderLM`
    returning all hidden states ``[L+1, B, T, D]`` (dev reads entries 10, 20 and 30).

    ``quantize``: None / ``"none"``, ``"int8"`` or ``"fp8"`` block linears; ``dtype``:
    storage and compute dtype; ``mesh``: shard the parameters by their logical axes.
    """
    folder = resolve_folder(path, subfolder)
    cfg = mistral_config(read_model_json(folder / "config.json", "Mistral config"), dtype)
    return load_decoder_lm(cfg, Weights.open(folder), str(folder), ignore=IGNORE,
                           quantize=quant_mode(quantize),
                           quantize_activations=quantize_activations, mesh=mesh)


__all__ = ["DEFAULTS", "MISTRAL3_TEXT", "IGNORE", "text_config", "mistral_config",
           "load_mistral3_text"]
