"""The decoder-LM text-encoder floor: a decoder-only language model's text stack run as a
text encoder — every layer's hidden states for a padded batch of prompts — that the newer
families share (LTX-2 reads Gemma-3's; FLUX.2 dev reads Mistral Small 3.1's, klein Qwen3's).

- :mod:`.config`: :class:`DecoderLMConfig`, one frozen dataclass whose switches are the ways
  the models differ (norm kind, embedding scale, q/k norms, sandwich norms, sliding / full
  layer pattern with a rope per kind, GQA, activation, logit scale and soft-capping);
- :mod:`.model`: :class:`DecoderLM` (Flax NNX) — ids + padding mask → hidden states
  ``[L+1, B, T, D]``, causal attention with the padding mask (left or right padding);
- :mod:`.convert`: the weight table (transformers keys, any of the prefixes a checkpoint
  class writes) and :func:`load_decoder_lm`, with ``quantize="int8"`` / ``"fp8"`` through
  :mod:`ditax.nn.quant` like the transformers' loaders;
- :mod:`.gemma3`: Gemma-3's ``config.json`` → config, :func:`load_gemma3`;
- :mod:`.tokenizer`: Gemma's tokenizer as transformers 5 builds it, through ``tokenizers``;
- :mod:`.llama_style`: the config reading Qwen3 and Mistral share (rotary kinds, GQA, head_dim);
- :mod:`.qwen3`: Qwen3's ``config.json`` → config, :func:`load_qwen3` (FLUX.2 klein);
- :mod:`.mistral`: the text model of ``Mistral3ForConditionalGeneration`` (or a
  ``MistralForCausalLM``), :func:`load_mistral3_text` (FLUX.2 dev);
- :mod:`.chat_template`: chat templates rendered with jinja2 as transformers'
  ``apply_chat_template`` renders them (:func:`render_chat_template`);
- :mod:`.chat_tokenizer`: Qwen3's and Mistral's tokenizers with their chat templates
  (:func:`load_qwen3_tokenizer`, :func:`load_mistral_tokenizer`);
- :mod:`.flux2_text`: FLUX.2's prompt embeddings as diffusers' pipelines build them
  (:func:`qwen3_prompt_embeds`, :func:`mistral3_prompt_embeds`).

Why the house's own floor and not Google DeepMind's JAX ``gemma`` package: the contract is
transformers' numerics within 1e-5 in float32 on the checkpoints the pipelines ship
(transformers safetensors under a ``text_encoder/`` folder), and the same code must serve
Qwen3 and Mistral. The ``gemma`` package reads Google's own (orbax) checkpoints with its own
parameter layout, is Flax Linen, knows only Gemma, and brings its own dependency stack
(kauldron, etc.); using it would mean a second conversion layer, a second module system and a
second place for the int8 / sharding / weight-table rules, while matching transformers'
choices (float32 norm products, softmax in float32, the SDPA zero rows of left padding, the
rope tables' rounding) would still have to be checked line by line. The floor written the
way the T5 / UMT5 encoders are — NNX modules, :class:`ditax.nn.Linear`, one weight table,
``ditax.nn.quant`` — is ~800 lines with its docstrings and has none of those seams.

Nothing is imported here (the family registry's discovery walks :mod:`ditax.models`); the
public names below resolve lazily.
"""

import importlib

_HOMES = {
    "config": ("DecoderLMConfig", "Rope"),
    "model": ("DecoderLM", "hidden_states"),
    "convert": ("weight_table", "load_decoder_lm", "text_prefix"),
    "gemma3": ("gemma3_config", "load_gemma3"),
    "tokenizer": ("load_gemma_tokenizer",),
    "qwen3": ("qwen3_config", "load_qwen3"),
    "mistral": ("mistral_config", "load_mistral3_text"),
    "chat_template": ("render_chat_template",),
    "chat_tokenizer": ("ChatTokenizer", "load_qwen3_tokenizer", "load_mistral_tokenizer"),
    "flux2_text": ("qwen3_prompt_embeds", "mistral3_prompt_embeds", "qwen3_prompt_ids",
                   "mistral3_prompt_ids", "SYSTEM_MESSAGE", "QWEN3_LAYERS", "MISTRAL3_LAYERS"),
}
_MODULE = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name):
    if name not in _MODULE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_MODULE[name]}"), name)


__all__ = sorted(_MODULE)
