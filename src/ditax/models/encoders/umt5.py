"""UMT5 text encoder (the encoder half of umT5-XXL that Wan conditions on), and Wan's
``encode_prompt``.

The encoder is :class:`ditax.models.encoders.t5.T5Encoder` with ``per_layer_bias``: every layer owns a
relative position bias table (T5 shares one from layer 0; UMT5 does not). Numerically matches
transformers' ``UMT5EncoderModel``; the layers, the weight table and the checks are
:mod:`ditax.models.encoders.t5`'s. Shapes: B batch, T text tokens, D ``d_model``.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np
from flax import nnx

from ditax.models.encoders.t5 import T5Config, T5Encoder, load_encoder


@dataclass(frozen=True)
class UMT5Config(T5Config):
    """UMT5 encoder shape, with transformers' ``UMT5Config`` field names (umT5-XXL defaults)."""

    vocab_size: int = 256384
    per_layer_bias: bool = True


class UMT5Encoder(T5Encoder):
    """UMT5 encoder: ids ``[B, T]`` + padding mask ``[B, T]`` → hidden states ``[B, T, D]``
    (:class:`~ditax.models.encoders.t5.T5Encoder` built from a :class:`UMT5Config`)."""


def load_text_encoder(path, dtype="float32", quantize: str = "none") -> UMT5Encoder:
    """Load a transformers ``UMT5EncoderModel`` folder (or a pipeline's ``text_encoder/``).

    Every tensor goes through :func:`ditax.models.encoders.t5.weight_table` (key check, shape check,
    torch ``[out, in]`` linears transposed) and is cast to ``dtype``; a mismatch raises one
    :class:`~ditax.errors.WeightError` naming the keys or shapes. ``quantize`` (``int8`` |
    ``fp8``): the block linears in 8 bits (:func:`ditax.models.encoders.t5.load_encoder`).
    """
    return load_encoder(path, dtype, config_class=UMT5Config, module_class=UMT5Encoder,
                        subfolder="text_encoder", quantize=quantize)


@nnx.jit
def _encode_jit(encoder: T5Encoder, ids, mask, keep):
    """Hidden states ``[B, T, D]`` of ``ids`` with every position where ``keep`` ``[B, T]`` is
    False set to zero — one program (eager ``where`` / ``arange`` / comparisons compiled a
    small program each per prompt shape)."""
    hidden = encoder(ids, mask)
    return jnp.where(keep[..., None], hidden, jnp.zeros((), hidden.dtype))


def encode_prompt(tokenizer, encoder: T5Encoder, prompts, max_length: int = 512):
    """Prompts → text embeddings ``[B, max_length, D]`` exactly as Wan's pipeline builds them.

    Prompts are cleaned (:func:`ditax.models.encoders.tokenizer.clean_prompt`), tokenized padded and
    truncated to ``max_length`` with the end token, encoded with the padding mask, and every
    position at or past a prompt's token count is set to zero.
    """
    from ditax.models.encoders.tokenizer import clean_prompt

    if isinstance(prompts, str):
        prompts = [prompts]
    ids, mask = tokenizer.encode([clean_prompt(p) for p in prompts], max_length)
    lengths = np.asarray(mask).astype(bool).sum(axis=1)
    keep = np.arange(max_length)[None, :] < lengths[:, None]
    # host arrays straight into the program (jnp.asarray of one compiles a copy per shape)
    return _encode_jit(encoder, np.asarray(ids), np.asarray(mask), keep)


__all__ = ["UMT5Config", "UMT5Encoder", "load_text_encoder", "encode_prompt"]
