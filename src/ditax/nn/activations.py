"""Activation functions by the names transformers' configs use (``hidden_act``, the ``ACT``
of T5's ``feed_forward_proj``), so a text or image encoder reads its activation from its
``config.json`` without a table of its own.

``gelu`` is the exact (erf) GELU; ``gelu_new`` / ``gelu_pytorch_tanh`` the tanh approximation
(what T5 v1.1's ``gated-gelu`` means); ``quick_gelu`` is ``x * sigmoid(1.702 x)`` (OpenAI CLIP).
"""

from __future__ import annotations

import jax

ACTIVATIONS = {
    "quick_gelu": lambda x: x * jax.nn.sigmoid(1.702 * x),
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
}

__all__ = ["ACTIVATIONS"]
