"""Parameter-free rearrangements of LTX-2's video VAE, channels-last ``[B, F, Y, X, C]``.

- :func:`fold` (the downsampler's space-to-depth) and :func:`unfold` (the upsampler's
  depth-to-space) over an ``(st, sh, sw)`` block: a folded channel is ``c * st sh sw +
  t * sh sw + i * sw + j`` for the block offset ``(t, i, j)``, as diffusers' ``permute`` /
  ``flatten`` orders it (the order decides which weights see which pixel);
- :func:`patchify` / :func:`unpatchify`: ``p x p`` pixel patches ↔ channels around the whole
  encoder / decoder; LTX-2's patch channel is ``c p² + (column offset) p + (row offset)``, the
  same order as the Wan 2.2 VAE's, whose functions these are.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ditax.models.vae.wan.shuffle import patchify, unpatchify


def fold(x: jax.Array, stride: tuple[int, int, int]) -> jax.Array:
    """``[B, F, Y, X, C]`` → ``[B, F/st, Y/sh, X/sw, C st sh sw]``."""
    st, sh, sw = stride
    b, f, yy, xx, c = x.shape
    x = x.reshape(b, f // st, st, yy // sh, sh, xx // sw, sw, c)
    x = x.transpose(0, 1, 3, 5, 7, 2, 4, 6)
    return x.reshape(b, f // st, yy // sh, xx // sw, c * st * sh * sw)


def unfold(x: jax.Array, stride: tuple[int, int, int]) -> jax.Array:
    """Inverse of :func:`fold`: ``[B, F, Y, X, C st sh sw]`` → ``[B, F st, Y sh, X sw, C]``."""
    st, sh, sw = stride
    b, f, yy, xx, c = x.shape
    x = x.reshape(b, f, yy, xx, c // (st * sh * sw), st, sh, sw)
    x = x.transpose(0, 1, 5, 2, 6, 3, 7, 4)
    return x.reshape(b, f * st, yy * sh, xx * sw, c // (st * sh * sw))


def group_mean(x: jax.Array, groups: int) -> jax.Array:
    """``[..., C]`` → ``[..., groups]``: the mean of each run of ``C / groups`` consecutive
    channels (the downsampler's shortcut after :func:`fold`)."""
    return jnp.mean(x.reshape(*x.shape[:-1], groups, x.shape[-1] // groups), axis=-1)


__all__ = ["fold", "group_mean", "patchify", "unfold", "unpatchify"]
