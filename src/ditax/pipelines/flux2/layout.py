"""FLUX.2's latent token layout and position ids, as diffusers' ``Flux2Pipeline`` /
``Flux2KleinPipeline`` build them.

A VAE latent ``[B, C, y, x]`` is *patchified* (each 2 x 2 patch one pixel of ``4C`` channels on
a ``[B, 4C, y/2, x/2]`` grid) and normalised by the VAE's latent BatchNorm statistics, which
live in that ``4C`` space — both the VAE's own (:class:`~ditax.models.vae.flux2.Flux2VAE`'s
``patchify_latents`` / ``normalize_latents``) — and then *packed* here: the grid laid out as
tokens ``[B, (y/2)(x/2), 4C]`` in row-major order.

Every token has a 4-D position id ``(t, h, w, l)``:

- the generated image's tokens: ``(0, row, column, 0)`` on its token grid;
- reference image ``i``'s tokens (image-conditioned generation): ``(10 + 10 i, row, column,
  0)`` on its own grid — a time offset per image, so references of any size never share a
  position with the output or with each other;
- the text tokens: ``(0, 0, 0, k)`` for token ``k``.

Ids are float32 (small integers, exact): the transformer's rotary embedding reads them as
floats. Everything here is numpy or jax alike (reshape / transpose only).
"""

from __future__ import annotations

import numpy as np

REFERENCE_T0 = 10    # the time coordinate of the first reference image (and the step between)


def pack(z):
    """``[B, D, Y, X]`` → tokens ``[B, Y X, D]`` (row-major)."""
    b, d, h, w = z.shape
    return z.reshape(b, d, h * w).transpose(0, 2, 1)


def unpack(tokens, h: int, w: int):
    """Tokens ``[B, h w, D]`` (row-major, as :func:`latent_ids` numbers them) → ``[B, D, h,
    w]``; ``h``, ``w``: the token grid. (diffusers scatters by the ids; with the row-major ids
    of :func:`latent_ids` that is this reshape.)"""
    b, _, d = tokens.shape
    return tokens.reshape(b, h, w, d).transpose(0, 3, 1, 2)


def grid_ids(t: int, h: int, w: int) -> np.ndarray:
    """float32 ``[h w, 4]``: ``(t, row, column, 0)`` in row-major order."""
    rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    ids = np.stack([np.full_like(rows, t), rows, cols, np.zeros_like(rows)], axis=-1)
    return ids.reshape(-1, 4).astype(np.float32)


def latent_ids(h: int, w: int) -> np.ndarray:
    """Position ids float32 ``[h w, 4]`` of the generated image's tokens (``h x w`` token
    grid)."""
    return grid_ids(0, h, w)


def reference_ids(grids) -> np.ndarray:
    """Position ids float32 ``[sum h_i w_i, 4]`` of reference images with token grids
    ``grids = [(h_0, w_0), ...]``, concatenated in order: image ``i`` at time
    ``10 + 10 i``."""
    parts = [grid_ids(REFERENCE_T0 * (i + 1), h, w) for i, (h, w) in enumerate(grids)]
    return np.concatenate(parts, axis=0) if parts else np.zeros((0, 4), np.float32)


def text_ids(length: int) -> np.ndarray:
    """Position ids float32 ``[T, 4]`` of ``length`` text tokens: ``(0, 0, 0, k)``."""
    ids = np.zeros((length, 4), np.float32)
    ids[:, 3] = np.arange(length)
    return ids


__all__ = ["REFERENCE_T0", "grid_ids", "latent_ids", "pack", "reference_ids", "text_ids",
           "unpack"]
