"""FLUX.2's latent token layout and position ids, as diffusers' ``Flux2Pipeline`` /
``Flux2KleinPipeline`` build them.

A VAE latent ``[B, C, y, x]`` is *patchified*: each 2 x 2 patch becomes one pixel of ``4C``
channels (channel-major, then the patch row, then the column) on a ``[B, 4C, y/2, x/2]`` grid.
The latent BatchNorm statistics of the VAE live in that ``4C`` space, so a latent is
normalised between patchify and *pack*, which lays the grid out as tokens
``[B, (y/2)(x/2), 4C]`` in row-major order. (The order of the 4C values equals FLUX.1's packing;
the BatchNorm between the two steps is FLUX.2's own.)

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

PATCH = 2            # latent pixels per token side
REFERENCE_T0 = 10    # the time coordinate of the first reference image (and the step between)


def patchify(z):
    """``[B, C, y, x]`` → ``[B, 4C, y/2, x/2]`` (each 2 x 2 patch's values channel-major)."""
    b, c, h, w = z.shape
    z = z.reshape(b, c, h // PATCH, PATCH, w // PATCH, PATCH).transpose(0, 1, 3, 5, 2, 4)
    return z.reshape(b, c * PATCH * PATCH, h // PATCH, w // PATCH)


def unpatchify(z):
    """``[B, 4C, y/2, x/2]`` → ``[B, C, y, x]``; the inverse of :func:`patchify`."""
    b, d, h, w = z.shape
    c = d // (PATCH * PATCH)
    z = z.reshape(b, c, PATCH, PATCH, h, w).transpose(0, 1, 4, 2, 5, 3)
    return z.reshape(b, c, h * PATCH, w * PATCH)


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


__all__ = ["PATCH", "REFERENCE_T0", "grid_ids", "latent_ids", "pack", "patchify",
           "reference_ids", "text_ids", "unpack", "unpatchify"]
