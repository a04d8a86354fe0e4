"""What the text encoders' calls share (:mod:`.t5`, :mod:`.decoder_lm`): the compute dtype a
config names, and the token ids with their mask."""

from __future__ import annotations

import jax.numpy as jnp

from ditax.errors import ConfigError


def compute_dtype(d, choices: str = "float32 or bfloat16"):
    """``jnp.dtype(d)``, refusing anything that is not a floating-point type (``choices``: the
    dtypes to suggest)."""
    try:
        dt = jnp.dtype(d)
    except TypeError:
        dt = None
    if dt is None or not jnp.issubdtype(dt, jnp.floating):
        raise ConfigError(f"dtype={d!r} is not supported; use {choices}")
    return dt


def token_mask(input_ids, attention_mask=None):
    """``[B, T]`` bool: the tokens ``attention_mask`` (``[B, T]``, > 0 = a token; None: every
    one) keeps of ``input_ids [B, T]``; a :class:`ValueError` naming both shapes where they
    differ."""
    b, t = input_ids.shape
    if attention_mask is None:
        return jnp.ones((b, t), bool)
    attention_mask = jnp.asarray(attention_mask)
    if attention_mask.shape != (b, t):
        raise ValueError(f"attention_mask shape {tuple(attention_mask.shape)} != input_ids "
                         f"shape {(b, t)}")
    return attention_mask > 0


__all__ = ["compute_dtype", "token_mask"]
