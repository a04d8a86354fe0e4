"""Gemma-3's text model on the decoder-LM floor: its ``config.json`` read into a
:class:`~ditax.models.encoders.decoder_lm.config.DecoderLMConfig`, and its loader.

Gemma-3 sets every switch of the floor: (1 + w) RMS norms, embeddings × sqrt(D), q/k norms,
sandwich norms, logits scaled by ``query_pre_attn_scalar**-0.5``, the tanh GELU, and layers
that alternate sliding-window attention (rope theta 1e4) with global attention (rope theta 1e6,
linearly scaled ×8 in the 4B / 12B / 27B models): five sliding layers then one global.

A folder may hold the multimodal ``Gemma3ForConditionalGeneration`` (LTX-2's
``text_encoder/``: ``config.json`` with a ``text_config``, weights under
``language_model.model.``, a SigLIP tower beside them that is not read), or a text-only
``Gemma3ForCausalLM`` / ``Gemma3TextModel``. A field missing from the config takes
transformers' ``Gemma3TextConfig`` default (the hub's Gemma-3 configs list only what differs
from it), and both config generations are read: ``rope_parameters`` + ``layer_types``
(transformers 5) and ``rope_theta`` / ``rope_local_base_freq`` / ``rope_scaling`` /
``sliding_window_pattern`` (earlier).
"""

from __future__ import annotations

from ditax.errors import ConfigError
from ditax.io.files import read_model_json
from ditax.io.hub import resolve_folder
from ditax.io.weights import Weights
from ditax.models.encoders.decoder_lm.config import FULL, SLIDING, DecoderLMConfig, Rope
from ditax.models.encoders.decoder_lm.convert import load_decoder_lm

# transformers' Gemma3TextConfig defaults (what a hub config leaves out)
DEFAULTS = dict(vocab_size=262_208, hidden_size=2304, intermediate_size=9216,
                num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6,
                query_pre_attn_scalar=256, sliding_window=4096,
                rope_theta=1_000_000.0, rope_local_base_freq=10_000.0, attention_bias=False,
                attn_logit_softcapping=None, use_bidirectional_attention=False)

# the multimodal checkpoint's other towers and the (tied) LM head: present, never read
IGNORE = (r"^(model\.)?vision_tower\.", r"^(model\.)?multi_modal_projector\.", r"^lm_head\.")


def text_config(raw: dict) -> dict:
    """The text model's part of a Gemma-3 ``config.json`` (``text_config`` of the multimodal
    model, else the file itself); a :class:`ConfigError` for another model type."""
    model_type = raw.get("model_type")
    if "text_config" in raw or model_type == "gemma3":
        text = raw.get("text_config") or {}
    elif model_type in (None, "gemma3_text"):
        text = raw
    else:
        raise ConfigError(f"config.json has model_type={model_type!r}, not Gemma-3 "
                          f"('gemma3' or 'gemma3_text'); point at a Gemma-3 text encoder")
    if text.get("model_type") not in (None, "gemma3_text"):
        raise ConfigError(f"config.json text_config has model_type={text['model_type']!r}, "
                          f"not 'gemma3_text'")
    return text


def _rope(params: dict) -> Rope:
    kind = params.get("rope_type", params.get("type", "default"))
    return Rope(theta=float(params["rope_theta"]), kind=kind,
                factor=float(params.get("factor", 1.0)))


def rope_of(text: dict) -> tuple[Rope, Rope]:
    """(global, sliding) rotary embeddings from either config generation."""
    params = text.get("rope_parameters")
    if isinstance(params, dict) and FULL in params:
        full = dict(params[FULL] or {})
        sliding = dict(params.get(SLIDING) or {})
        full.setdefault("rope_theta", text.get("rope_theta", DEFAULTS["rope_theta"]))
        sliding.setdefault("rope_theta", text.get("rope_local_base_freq",
                                                  DEFAULTS["rope_local_base_freq"]))
        return _rope(full), _rope(sliding)
    full = dict(params or text.get("rope_scaling") or {})
    full.setdefault("rope_theta", text.get("rope_theta", DEFAULTS["rope_theta"]))
    sliding = {"rope_theta": text.get("rope_local_base_freq", DEFAULTS["rope_local_base_freq"])}
    return _rope(full), _rope(sliding)


def gemma3_config(raw: dict, dtype: str = "float32") -> DecoderLMConfig:
    """A Gemma-3 ``config.json`` dict (multimodal or text-only) → the floor's config."""
    t = {**DEFAULTS, **{k: v for k, v in text_config(raw).items() if v is not None
                        or k == "attn_logit_softcapping"}}
    if t["use_bidirectional_attention"]:
        raise ConfigError("config.json has use_bidirectional_attention=true (an embedding "
                          "model); ditax's Gemma-3 text encoder is the causal one")
    n = t["num_hidden_layers"]
    layer_types = t.get("layer_types")
    if not layer_types:
        # every pattern-th layer is global (transformers' default pattern: 6)
        pattern = t.get("sliding_window_pattern") or t.get("_sliding_window_pattern") or 6
        layer_types = [SLIDING if (i + 1) % pattern else FULL for i in range(n)]
    full, sliding = rope_of(t)
    cfg = DecoderLMConfig(
        vocab_size=t["vocab_size"], hidden_size=t["hidden_size"],
        intermediate_size=t["intermediate_size"], num_layers=n,
        num_heads=t["num_attention_heads"], num_kv_heads=t["num_key_value_heads"],
        head_dim=t["head_dim"], layer_types=tuple(layer_types), rope_full=full,
        rope_sliding=sliding, sliding_window=t["sliding_window"],
        rms_norm_eps=float(t["rms_norm_eps"]), norm="gemma", embed_scale=True, qk_norm=True,
        sandwich_norm=True, query_scale=float(t["query_pre_attn_scalar"]) ** -0.5,
        attn_softcap=t["attn_logit_softcapping"], attention_bias=bool(t["attention_bias"]),
        activation=t["hidden_activation"], dtype=dtype, name="Gemma-3")
    cfg.check()
    return cfg


def load_gemma3(path, dtype: str = "float32", *, quantize: str = "none",
                quantize_activations: bool = False, mesh=None,
                subfolder: str = "text_encoder"):
    """Load Gemma-3's text model from a transformers folder or a pipeline folder's
    ``subfolder/`` (LTX-2: ``text_encoder/``) → a
    :class:`~ditax.models.encoders.decoder_lm.model.DecoderLM` returning all hidden states.

    ``dtype``: storage and compute dtype; ``quantize``: ``int8`` / ``fp8`` block linears
    (:func:`~ditax.models.encoders.decoder_lm.convert.load_decoder_lm`); ``mesh``: shard the
    parameters by their logical axes. Errors name the file, key or value at fault.
    """
    folder = resolve_folder(path, subfolder)
    cfg = gemma3_config(read_model_json(folder / "config.json", "Gemma-3 config"), dtype)
    return load_decoder_lm(cfg, Weights.open(folder), str(folder), ignore=IGNORE,
                           quantize=quantize, quantize_activations=quantize_activations,
                           mesh=mesh)


__all__ = ["DEFAULTS", "IGNORE", "text_config", "rope_of", "gemma3_config", "load_gemma3"]
