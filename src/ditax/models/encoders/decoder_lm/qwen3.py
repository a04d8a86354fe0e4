"""Qwen3's text model on the decoder-LM floor (FLUX.2 klein's text encoder: Qwen3-4B for
klein 4B, Qwen3-8B for klein 9B): its ``config.json`` read into a
:class:`~ditax.models.encoders.decoder_lm.config.DecoderLMConfig`, and its loader.

Qwen3 is Llama-shaped (:mod:`.llama_style`) plus an RMS norm on every query and key head over
``head_dim`` before the rotation; ``head_dim`` is its own field (128), not
``hidden_size / heads``. Sliding-window layers exist only with ``use_sliding_window`` (layers
from ``max_window_layers`` on), as transformers' ``Qwen3Config`` builds ``layer_types``; the
released models have none. A ``Qwen3ForCausalLM`` folder (klein's ``text_encoder/``) keeps the
stack under ``model.``; its LM head (tied or not) is never read.
"""

from __future__ import annotations

from ditax.errors import ConfigError
from ditax.io.files import read_model_json
from ditax.io.hub import resolve_folder
from ditax.io.weights import Weights
from ditax.models.encoders.decoder_lm.config import FULL, SLIDING, DecoderLMConfig
from ditax.models.encoders.decoder_lm.convert import load_decoder_lm
from ditax.models.encoders.decoder_lm.llama_style import llama_style_config, quant_mode, rope_of

# transformers' Qwen3Config defaults (what a config.json may leave out)
DEFAULTS = dict(vocab_size=151_936, hidden_size=4096, intermediate_size=22_016,
                num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                head_dim=128, hidden_act="silu", rms_norm_eps=1e-6, attention_bias=False,
                use_sliding_window=False, sliding_window=4096, max_window_layers=28)
DEFAULT_THETA = 10_000.0

IGNORE = (r"^lm_head\.",)


def qwen3_config(raw: dict, dtype: str = "float32") -> DecoderLMConfig:
    """A Qwen3 ``config.json`` dict (``Qwen3ForCausalLM`` / ``Qwen3Model``) → the floor's
    config; a :class:`ConfigError` naming the value for anything else."""
    model_type = raw.get("model_type")
    if model_type not in (None, "qwen3"):
        raise ConfigError(f"config.json has model_type={model_type!r}, not 'qwen3'; point at "
                          f"a Qwen3 text encoder (FLUX.2 klein's text_encoder/)")
    t = {**DEFAULTS, **{k: v for k, v in raw.items() if v is not None or k == "head_dim"}}
    n = t["num_hidden_layers"]
    window = t["sliding_window"] if t["use_sliding_window"] else None
    layer_types = t.get("layer_types")
    if not layer_types and isinstance(n, int):
        layer_types = [SLIDING if window is not None and i >= t["max_window_layers"] else FULL
                       for i in range(n)]
    if SLIDING not in (layer_types or ()):
        window = None
    return llama_style_config(t, name="Qwen3", qk_norm=True, layer_types=layer_types or (),
                              sliding_window=window, rope=rope_of(t, DEFAULT_THETA, "Qwen3"),
                              dtype=dtype)


def load_qwen3(path, quantize=None, *, dtype: str = "float32",
               quantize_activations: bool = False, mesh=None, subfolder: str = "text_encoder"):
    """Load Qwen3's text model from a transformers folder or a pipeline folder's
    ``subfolder/`` (FLUX.2 klein: ``text_encoder/``) → a
    :class:`~ditax.models.encoders.decoder_lm.model.DecoderLM` returning all hidden states
    ``[L+1, B, T, D]`` (klein reads entries 9, 18 and 27).

    ``quantize``: None / ``"none"``, ``"int8"`` or ``"fp8"`` block linears
    (:func:`~ditax.models.encoders.decoder_lm.convert.load_decoder_lm`); ``dtype``: storage
    and compute dtype; ``mesh``: shard the parameters by their logical axes.
    """
    folder = resolve_folder(path, subfolder)
    cfg = qwen3_config(read_model_json(folder / "config.json", "Qwen3 config"), dtype)
    return load_decoder_lm(cfg, Weights.open(folder), str(folder), ignore=IGNORE,
                           quantize=quant_mode(quantize),
                           quantize_activations=quantize_activations, mesh=mesh)


__all__ = ["DEFAULTS", "IGNORE", "qwen3_config", "load_qwen3"]
