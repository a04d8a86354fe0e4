"""FLUX.2's prompt embeddings, built as diffusers' pipelines build them from their decoder-LM
text encoders.

- klein (``Flux2KleinPipeline``, Qwen3): each prompt rendered alone as a one-message chat
  (``{"role": "user", "content": prompt}``, ``add_generation_prompt=True``,
  ``enable_thinking=False``), tokenized with the tokenizer's own special tokens, padded
  ("max_length", on the tokenizer's side) and truncated to ``max_sequence_length``; hidden
  states 9, 18 and 27.
- dev (``Flux2Pipeline``, Mistral Small 3.1): every prompt (``[IMG]`` removed) after a
  system message (:data:`SYSTEM_MESSAGE`), both as text blocks, rendered without a
  generation prompt; tokenized as the Pixtral processor does (no added special tokens when
  the text already begins with ``<s>``, as Mistral's template makes it), padded / truncated
  likewise; hidden states 10, 20 and 30.

Both then stack the chosen hidden states ``[B, T, D]`` along a new axis after the batch and
move it behind the tokens: ``[B, T, len(layers)·D]``, channel ``j·D + d`` being layer
``layers[j]``'s channel ``d``. The padded tokens are kept (the FLUX.2 transformer attends to
all of them, as diffusers' does). Shapes: B prompts, T ``max_sequence_length``, D the text
model's ``hidden_size``.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from ditax.errors import RequestError

QWEN3_LAYERS = (9, 18, 27)
MISTRAL3_LAYERS = (10, 20, 30)

# diffusers' pipelines/flux2/system_messages.py SYSTEM_MESSAGE (from Black Forest Labs' flux2
# repository): the dev pipeline's system turn
SYSTEM_MESSAGE = ("You are an AI that reasons about image descriptions. You give structured "
                  "responses focusing on object relationships, object\nattribution and actions "
                  "without speculation.")


def _prompts(prompts) -> list[str]:
    prompts = [prompts] if isinstance(prompts, str) else list(prompts)
    if not prompts or not all(isinstance(p, str) for p in prompts):
        raise RequestError(f"prompts must be a string or a non-empty list of strings; got "
                           f"{prompts!r}")
    return prompts


def qwen3_conversations(prompts) -> list[list[dict]]:
    """klein's chats: one user message per prompt."""
    return [[{"role": "user", "content": p}] for p in _prompts(prompts)]


def mistral3_conversations(prompts, system_message: str = SYSTEM_MESSAGE) -> list[list[dict]]:
    """dev's chats (diffusers' ``format_input`` without images): the system message, then the
    prompt with any ``[IMG]`` removed, each as one text block."""
    return [[{"role": "system", "content": [{"type": "text", "text": system_message}]},
             {"role": "user", "content": [{"type": "text", "text": p.replace("[IMG]", "")}]}]
            for p in _prompts(prompts)]


def qwen3_prompt_ids(tokenizer, prompts, max_len: int = 512):
    """klein's token ids and padding mask, int32 ``[B, max_len]`` each."""
    texts = tokenizer.apply_chat_template(qwen3_conversations(prompts),
                                          add_generation_prompt=True, enable_thinking=False)
    return tokenizer.encode(texts, max_len, add_special_tokens=True)


def mistral3_prompt_ids(tokenizer, prompts, max_len: int = 512,
                        system_message: str = SYSTEM_MESSAGE):
    """dev's token ids and padding mask, int32 ``[B, max_len]`` each."""
    texts = tokenizer.apply_chat_template(mistral3_conversations(prompts, system_message),
                                          add_generation_prompt=False)
    bos = tokenizer.special_tokens.get("bos_token")
    # the processor adds no special tokens to text the template already began with <s>
    # (it asks the first prompt)
    add = not (bos is not None and texts[0].startswith(bos))
    return tokenizer.encode(texts, max_len, add_special_tokens=add)


def spread_layers(num_layers: int, count: int) -> tuple[int, ...]:
    """``count`` hidden states spread over a text model of ``num_layers`` layers as FLUX.2's
    own are (at ``i / (count + 1)`` of its depth: Qwen3-4B's 36 layers give (9, 18, 27),
    Mistral Small 3.1's 40 give (10, 20, 30)): a choice a smaller encoder can read."""
    return tuple(num_layers * (i + 1) // (count + 1) for i in range(count))


def check_text_layers(layers, num_layers: int, width: int, joint: int | None = None,
                      where: str = "the text encoder",
                      said: str = "text_encoder_out_layers") -> tuple[int, ...]:
    """The hidden-state ``layers`` FLUX.2 reads from ``where`` (a text model of
    ``num_layers`` layers, ``width`` wide; ``joint``: the transformer's
    ``joint_attention_dim``, which ``len(layers) · width`` must fill; None: not checked).
    :class:`RequestError` naming the value and a choice that works, with the keys that set it
    (``text_encoder_out_layers=`` of the call, ``model.text_encoder_out_layers`` of ditax
    generate / serve; ``said``: how the message names the value)."""
    given = len(layers) if isinstance(layers, (list, tuple)) and layers else 3
    count = joint // width if joint and width and joint % width == 0 else given
    good = spread_layers(num_layers, count)
    fix = (f"e.g. text_encoder_out_layers={good} in the call, or model.text_encoder_out_layers="
           f"[{','.join(map(str, good))}] for ditax generate / serve")
    if isinstance(layers, int) or not isinstance(layers, (list, tuple)) or not layers \
            or not all(isinstance(i, int) and not isinstance(i, bool) for i in layers):
        raise RequestError(f"{said}={layers!r} must be a non-empty tuple of ints "
                           f"(hidden-state indices); {fix}")
    layers = tuple(layers)
    if not all(0 <= i <= num_layers for i in layers):
        raise RequestError(f"{said}={layers}: {where} has hidden states "
                           f"0..{num_layers} ({num_layers} layers); {fix}")
    if joint is not None and len(layers) * width != joint:
        raise RequestError(f"{said}={layers}: {len(layers)} layers x the text "
                           f"width {width} = {len(layers) * width}, but the transformer reads "
                           f"{joint} (joint_attention_dim); pick {count} layers, {fix}")
    return layers


def _check_layers(model, layers) -> tuple[int, ...]:
    return check_text_layers(layers, model.cfg.num_layers, model.cfg.hidden_size,
                             where=f"{model.cfg.name}")


@nnx.jit(static_argnums=3)
def stacked_hidden_states(model, input_ids, attention_mask, layers: tuple[int, ...]):
    """The text model's hidden states ``layers`` as FLUX.2 reads them: ``[B, T, len·D]``
    (compiled once per shape and layer choice)."""
    h = model(input_ids, attention_mask)[jnp.asarray(layers)]        # [len, B, T, D]
    n, b, t, d = h.shape
    return jnp.transpose(h, (1, 2, 0, 3)).reshape(b, t, n * d)


def qwen3_prompt_embeds(model, tokenizer, prompts, max_len: int = 512,
                        layers=QWEN3_LAYERS):
    """FLUX.2 klein's ``prompt_embeds`` ``[B, max_len, 3·D]`` of ``prompts`` (diffusers'
    ``Flux2KleinPipeline._get_qwen3_prompt_embeds``): ``model`` from
    :func:`~ditax.models.encoders.decoder_lm.qwen3.load_qwen3`, ``tokenizer`` from
    :func:`~ditax.models.encoders.decoder_lm.chat_tokenizer.load_qwen3_tokenizer`."""
    layers = _check_layers(model, layers)
    ids, mask = qwen3_prompt_ids(tokenizer, prompts, max_len)
    return stacked_hidden_states(model, jnp.asarray(ids), jnp.asarray(mask), layers)


def mistral3_prompt_embeds(model, tokenizer, prompts, max_len: int = 512,
                           layers=MISTRAL3_LAYERS, system_message: str = SYSTEM_MESSAGE):
    """FLUX.2 dev's ``prompt_embeds`` ``[B, max_len, 3·D]`` of ``prompts`` (diffusers'
    ``Flux2Pipeline._get_mistral_3_small_prompt_embeds``): ``model`` from
    :func:`~ditax.models.encoders.decoder_lm.mistral.load_mistral3_text`, ``tokenizer`` from
    :func:`~ditax.models.encoders.decoder_lm.chat_tokenizer.load_mistral_tokenizer`."""
    layers = _check_layers(model, layers)
    ids, mask = mistral3_prompt_ids(tokenizer, prompts, max_len, system_message)
    return stacked_hidden_states(model, jnp.asarray(ids), jnp.asarray(mask), layers)


__all__ = ["QWEN3_LAYERS", "MISTRAL3_LAYERS", "SYSTEM_MESSAGE", "check_text_layers",
           "spread_layers", "qwen3_conversations",
           "mistral3_conversations", "qwen3_prompt_ids", "mistral3_prompt_ids",
           "stacked_hidden_states", "qwen3_prompt_embeds", "mistral3_prompt_embeds"]
