"""FLUX.1's packed latent layout, as diffusers' ``FluxPipeline`` builds it.

A latent image ``[B, C, h, w]`` is cut into 2 x 2 patches; each patch is one token of
``4C`` values (channel-major, then the patch row, then the column): ``[B, (h/2)(w/2), 4C]``,
tokens in row-major order. The image tokens' position ids are ``(0, row, column)`` on the
``(h/2) x (w/2)`` token grid; the text tokens' are all zero.
"""

from __future__ import annotations

import numpy as np

PACK = 2   # latent pixels per token side


def pack(z):
    """``[B, C, h, w]`` → packed tokens ``[B, (h/2)(w/2), 4C]`` (numpy or jax)."""
    b, c, h, w = z.shape
    z = z.reshape(b, c, h // PACK, PACK, w // PACK, PACK).transpose(0, 2, 4, 1, 3, 5)
    return z.reshape(b, (h // PACK) * (w // PACK), c * PACK * PACK)


def unpack(tokens, h: int, w: int):
    """Packed tokens ``[B, (h/2)(w/2), 4C]`` → latents ``[B, C, h, w]`` (``h``, ``w``: the
    latent size)."""
    b, _, d = tokens.shape
    c = d // (PACK * PACK)
    z = tokens.reshape(b, h // PACK, w // PACK, c, PACK, PACK).transpose(0, 3, 1, 4, 2, 5)
    return z.reshape(b, c, h, w)


def image_ids(h: int, w: int) -> np.ndarray:
    """Position ids float32 ``[(h/2)(w/2), 3]`` of the image tokens: ``(0, row, column)``."""
    rows, cols = np.meshgrid(np.arange(h // PACK), np.arange(w // PACK), indexing="ij")
    ids = np.stack([np.zeros_like(rows), rows, cols], axis=-1).astype(np.float32)
    return ids.reshape(-1, 3)


def text_ids(length: int) -> np.ndarray:
    """Position ids float32 ``[T, 3]`` of the text tokens: zeros."""
    return np.zeros((length, 3), np.float32)


__all__ = ["PACK", "image_ids", "pack", "text_ids", "unpack"]
