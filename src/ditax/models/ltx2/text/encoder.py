"""LTX-2's text path: prompts → the video and audio streams' text embeddings and the mask
the transformer takes, equal to diffusers' ``LTX2Pipeline.encode_prompt`` followed by its
``connectors`` call.

What the pipeline does, and :func:`encode_ltx2_prompt` with it:

1. strip each prompt; tokenize with Gemma's tokenizer padded on the LEFT (the pipeline sets
   ``padding_side="left"``; the pad token, else the end token) to ``max_sequence_length``
   (1024), truncated, ``<bos>`` first;
2. run Gemma-3 with the padding mask and take every hidden state (the embeddings, each
   layer's output, the last after the final norm), stacked on a last axis and flattened
   channel-major: ``[B, T, C·(L+1)]`` (:func:`gemma_prompt_embeds`);
3. the connectors (:class:`~ditax.models.ltx2.text.connectors.LTX2TextConnectors`, told the
   tokenizer's padding side) → ``encoder_hidden_states`` (video ``[B, T, Dv]``),
   ``audio_encoder_hidden_states`` (``[B, T, Da]``) and ``encoder_attention_mask`` (used for
   both streams).

Each prompt's result depends on that prompt alone, so with guidance the negative and positive
prompts may be encoded together (the pipeline's ``[negative, positive]`` batch) or apart.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
from flax import nnx

from ditax.errors import PipelineLoadError, RequestError
from ditax.io.files import read_model_json
from ditax.io.hub import resolve_folder
from ditax.models.encoders.decoder_lm.gemma3 import gemma3_config, load_gemma3
from ditax.models.encoders.decoder_lm.tokenizer import load_gemma_tokenizer
from ditax.models.ltx2.text.config import LTX2ConnectorsConfig
from ditax.models.ltx2.text.convert import load_connectors

PADDING_SIDE = "left"          # LTX2Pipeline._get_gemma_prompt_embeds sets it
MAX_SEQUENCE_LENGTH = 1024     # LTX2Pipeline's default


class LTX2Text(NamedTuple):
    """The text components of an LTX-2 pipeline folder: ``tokenizer``
    (:class:`~ditax.models.encoders.tokenizer.Tokenizer`, left padding), ``text_encoder``
    (Gemma-3, :class:`~ditax.models.encoders.decoder_lm.model.DecoderLM`), ``connectors``
    (:class:`~ditax.models.ltx2.text.connectors.LTX2TextConnectors`)."""

    tokenizer: object
    text_encoder: object
    connectors: object


def check_fit(encoder_cfg, connectors_cfg, tokenizer=None) -> None:
    """The connectors take what this Gemma gives (``caption_channels`` = its width,
    ``text_proj_in_factor`` = its layers + 1) and the tokenizer's ids are in its vocabulary
    (configs: a :class:`~ditax.models.encoders.decoder_lm.config.DecoderLMConfig` and an
    :class:`~ditax.models.ltx2.text.config.LTX2ConnectorsConfig`); a
    :class:`PipelineLoadError` naming both numbers otherwise."""
    e, c = encoder_cfg, connectors_cfg
    if (c.caption_channels, c.text_proj_in_factor) != (e.hidden_size, e.num_layers + 1):
        raise PipelineLoadError(
            f"connectors expect caption_channels={c.caption_channels} × text_proj_in_factor="
            f"{c.text_proj_in_factor} but the text encoder gives hidden_size={e.hidden_size} × "
            f"{e.num_layers + 1} hidden states; text_encoder/ and connectors/ are from "
            f"different models")
    if tokenizer is not None:
        n = tokenizer.backend.get_vocab_size(with_added_tokens=True)
        if n > e.vocab_size:
            raise PipelineLoadError(f"the tokenizer has {n} tokens but the text encoder's "
                                    f"vocabulary only {e.vocab_size}; tokenizer/ and "
                                    f"text_encoder/ are from different models")


def load_ltx2_text(path, dtype: str = "float32", *, quantize: str = "none",
                   mesh=None, connector_loras=None) -> LTX2Text:
    """An LTX-2 pipeline folder's ``tokenizer/``, ``text_encoder/`` (Gemma-3; ``quantize``:
    ``int8`` / ``fp8`` block linears, ``mesh``: sharded parameters) and ``connectors/``
    (``connector_loras``: :func:`~ditax.models.ltx2.text.convert.load_connectors`'s
    ``loras``); the three configs are checked to fit together (:func:`check_fit`) before any
    weight is read."""
    tokenizer = load_gemma_tokenizer(path, "tokenizer", padding_side=PADDING_SIDE)
    te = resolve_folder(path, "text_encoder")
    co = resolve_folder(path, "connectors")
    check_fit(gemma3_config(read_model_json(te / "config.json", "Gemma-3 config"), dtype),
              LTX2ConnectorsConfig.from_diffusers(
                  read_model_json(co / "config.json", "LTX-2 connectors config"), dtype),
              tokenizer)
    encoder = load_gemma3(te, dtype, quantize=quantize, mesh=mesh)
    connectors = load_connectors(co, dtype, loras=connector_loras)
    return LTX2Text(tokenizer, encoder, connectors)


def _prompts(prompts) -> list[str]:
    if isinstance(prompts, str):
        prompts = [prompts]
    if (not isinstance(prompts, (list, tuple)) or not prompts
            or not all(isinstance(p, str) for p in prompts)):
        raise RequestError(f"prompt must be a string or a non-empty list of strings, got "
                           f"{type(prompts).__name__}")
    return [p.strip() for p in prompts]


def _check_length(max_sequence_length, connectors=None) -> None:
    if (not isinstance(max_sequence_length, int) or isinstance(max_sequence_length, bool)
            or max_sequence_length < 1):
        raise RequestError(f"max_sequence_length={max_sequence_length!r}; expected a positive "
                           f"int (LTX-2 uses {MAX_SEQUENCE_LENGTH})")
    if connectors is None:
        return
    for which, s in (("video", connectors.cfg.video), ("audio", connectors.cfg.audio)):
        if s.registers and max_sequence_length % s.registers:
            raise RequestError(f"max_sequence_length={max_sequence_length} is not a multiple "
                               f"of the {which} connector's {s.registers} learnable registers; "
                               f"use a multiple of {s.registers} (LTX-2 uses "
                               f"{MAX_SEQUENCE_LENGTH})")


def stack_hidden_states(hidden):
    """hidden states ``[L+1, B, T, C]`` → ``[B, T, C·(L+1)]``, channel-major (the pipeline's
    ``torch.stack(hidden_states, -1).flatten(2, 3)``)."""
    n, b, t, c = hidden.shape
    return jnp.transpose(hidden, (1, 2, 3, 0)).reshape(b, t, c * n)


@nnx.jit
def _embeds(encoder, ids, mask):
    return stack_hidden_states(encoder(ids, mask))


@nnx.jit(static_argnames=("padding_side",))
def _encode(encoder, connectors, ids, mask, padding_side):
    return connectors(stack_hidden_states(encoder(ids, mask)), mask, padding_side)


def _tokenize(tokenizer, prompts, max_sequence_length):
    ids, mask = tokenizer.encode(_prompts(prompts), max_sequence_length)
    return jnp.asarray(ids), jnp.asarray(mask)


def gemma_prompt_embeds(tokenizer, text_encoder, prompts,
                        max_sequence_length: int = MAX_SEQUENCE_LENGTH):
    """Prompts → ``(embeds [B, T, C·(L+1)], mask int32 [B, T])``: the pipeline's
    ``_get_gemma_prompt_embeds`` (steps 1–2 of the module docstring)."""
    _check_length(max_sequence_length)
    ids, mask = _tokenize(tokenizer, prompts, max_sequence_length)
    return _embeds(text_encoder, ids, mask), mask


def encode_ltx2_prompt(text: LTX2Text, prompts, max_sequence_length: int = MAX_SEQUENCE_LENGTH):
    """Prompts (a string or a list) → ``(video [B, T, Dv], audio [B, T, Da], mask int32
    [B, T])``: what ``LTX2Pipeline.__call__`` passes the transformer as
    ``encoder_hidden_states``, ``audio_encoder_hidden_states`` and ``encoder_attention_mask``
    / ``audio_encoder_attention_mask``, with ``T = max_sequence_length`` (a multiple of the
    connectors' register count). One compiled program per batch size and length."""
    _check_length(max_sequence_length, text.connectors)
    ids, mask = _tokenize(text.tokenizer, prompts, max_sequence_length)
    return _encode(text.text_encoder, text.connectors, ids, mask,
                   text.tokenizer.padding_side)


__all__ = ["LTX2Text", "load_ltx2_text", "check_fit", "gemma_prompt_embeds",
           "encode_ltx2_prompt", "stack_hidden_states", "PADDING_SIDE", "MAX_SEQUENCE_LENGTH"]
