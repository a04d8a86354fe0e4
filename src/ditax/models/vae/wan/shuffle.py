"""Parameter-free rearrangements of the Wan 2.2 VAE, channels-last ``[B, F, Y, X, C]``.

- :func:`patchify` / :func:`unpatchify`: ``p x p`` pixel patches ↔ channels, around the whole
  encoder / decoder (the 2.2 VAE sees a 3-channel video as ``3 p^2`` channels at ``1/p`` size);
- :func:`avg_down`: the encoder's shortcut (diffusers ``AvgDown3D``): space-to-channel over a
  ``ft x fs x fs`` block, then the mean of consecutive channel groups down to ``C_out``;
- :func:`dup_up`: the decoder's shortcut (diffusers ``DupUp3D``): each channel repeated, then
  channel-to-space (and time) over a ``ft x fs x fs`` block.

The channel orders follow diffusers exactly (they decide which weights see which pixel): a patch
channel is ``c p^2 + (column offset) p + (row offset)``; the shortcut block index is
``(c, time offset, row offset, column offset)`` flattened in that order.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def patchify(x: jax.Array, p: int) -> jax.Array:
    """``[B, F, H, W, C]`` → ``[B, F, H/p, W/p, C p^2]``."""
    b, f, h, w, c = x.shape
    x = x.reshape(b, f, h // p, p, w // p, p, c)
    return x.transpose(0, 1, 2, 4, 6, 5, 3).reshape(b, f, h // p, w // p, c * p * p)


def unpatchify(x: jax.Array, p: int) -> jax.Array:
    """Inverse of :func:`patchify`: ``[B, F, Y, X, C p^2]`` → ``[B, F, Y p, X p, C]``."""
    b, f, yy, xx, cp = x.shape
    x = x.reshape(b, f, yy, xx, cp // (p * p), p, p)
    return x.transpose(0, 1, 2, 6, 3, 5, 4).reshape(b, f, yy * p, xx * p, cp // (p * p))


def video_pixels(x: jax.Array, p: int) -> jax.Array:
    """The decoder's unclipped channels-last frames ``[B, F, Y, X, C p^2]`` as the public video
    ``[B, C, F, Y p, X p]`` clipped to [-1, 1] (:func:`unpatchify` where ``p > 1``): what
    ``WanVAE.decode`` returns, and each chunk of ``decode_chunks`` / the streaming decoder."""
    if p > 1:
        x = unpatchify(x, p)
    return jnp.transpose(jnp.clip(x, -1.0, 1.0), (0, 4, 1, 2, 3))


def avg_down(x: jax.Array, cout: int, ft: int, fs: int) -> jax.Array:
    """``[B, F, Y, X, C]`` → ``[B, ceil(F/ft), Y/fs, X/fs, cout]``.

    Frames are zero-padded at the front to a multiple of ``ft`` (a video's first chunk, one
    frame, pools with a zero frame, as diffusers does).
    """
    pad = -x.shape[1] % ft
    if pad:
        x = jnp.pad(x, ((0, 0), (pad, 0), (0, 0), (0, 0), (0, 0)))
    b, f, yy, xx, c = x.shape
    x = x.reshape(b, f // ft, ft, yy // fs, fs, xx // fs, fs, c)
    x = x.transpose(0, 1, 3, 5, 7, 2, 4, 6)
    x = x.reshape(b, f // ft, yy // fs, xx // fs, cout, c * ft * fs * fs // cout)
    return jnp.mean(x, axis=-1)


def dup_up(x: jax.Array, cout: int, ft: int, fs: int, first: bool) -> jax.Array:
    """``[B, F, Y, X, C]`` → ``[B, F ft, Y fs, X fs, cout]``; on a video's ``first`` chunk the
    first ``ft - 1`` frames are dropped (frame 0 stays one frame, like the main path)."""
    b, f, yy, xx, c = x.shape
    x = jnp.repeat(x, cout * ft * fs * fs // c, axis=-1)
    x = x.reshape(b, f, yy, xx, cout, ft, fs, fs).transpose(0, 1, 5, 2, 6, 3, 7, 4)
    x = x.reshape(b, f * ft, yy * fs, xx * fs, cout)
    return x[:, ft - 1:] if first else x


__all__ = ["avg_down", "dup_up", "patchify", "unpatchify", "video_pixels"]
