"""Where the image and text tokens of a dual-stream DiT's joint sequence are placed (FLUX.1's
and FLUX.2's blocks: :mod:`ditax.models.flux`, :mod:`ditax.models.flux2`).

Flux attends over one joint sequence of ``L`` image and ``T`` text tokens (diffusers
concatenates ``[text; image]``). Attention does not depend on the order of its tokens (each
query sees the same set of rotated keys and values; RoPE rotates every token by its own
position ids), so ditax is free to place them where they cost nothing:

- **shard-major over the context shards.** With the sequence split over ``c`` context
  shards, one concatenation would put the text on the first shard(s) and shift every image
  token's shard, so forming the joint sequence would move data between devices in every
  block. Instead each stream is padded to a multiple of ``c`` (``L' = ⌈L/c⌉·c``,
  ``T' = ⌈T/c⌉·c``) and shard ``i`` holds its ``L'/c`` image tokens followed by its
  ``T'/c`` text tokens::

      joint = [i_0, t_0 | i_1, t_1 | ... | i_{c-1}, t_{c-1}],   S' = L' + T' tokens,

  so joining and splitting the streams are local to each device (a reshape and a
  concatenation of per-shard blocks), and ``ulysses`` / ``ring`` / ``ulysses_ring`` see one
  evenly split sequence. Pad tokens are masked as keys (``kv_mask``) and dropped at the end.
- **image first.** On one device (``c = 1``, no padding) the joint sequence is
  ``[image; text]``: with a right-padded text mask the valid keys come first, so the kernels
  that take key masks as lengths (``cudnn``, ``te``) can run it. On ``c > 1`` shards the
  mask is a prefix only without image padding and without a text mask
  (:func:`check_length_masks` refuses the rest for those kernels).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from ditax.errors import RequestError
from ditax.intmath import ceil_div


class JointLayout(NamedTuple):
    """The joint sequence of ``image`` image and ``text`` text tokens over ``shards`` context
    shards (static: part of the traced program)."""

    image: int
    text: int
    shards: int

    @property
    def image_padded(self) -> int:
        """``L'``: image tokens padded to a multiple of the shards."""
        return ceil_div(self.image, self.shards) * self.shards

    @property
    def text_padded(self) -> int:
        """``T'``: text tokens padded to a multiple of the shards."""
        return ceil_div(self.text, self.shards) * self.shards

    @property
    def length(self) -> int:
        """``S' = L' + T'``."""
        return self.image_padded + self.text_padded

    @property
    def padded(self) -> bool:
        return (self.image_padded, self.text_padded) != (self.image, self.text)

    def pad(self, x: jax.Array, axis: int, image: bool) -> jax.Array:
        """Pad the image (``image=True``) or text tokens on ``axis`` of ``x`` with zeros."""
        n, want = (self.image, self.image_padded) if image else (self.text, self.text_padded)
        if n == want:
            return x
        widths = [(0, 0)] * x.ndim
        widths[axis] = (0, want - n)
        return jnp.pad(x, widths)

    def join(self, image: jax.Array, text: jax.Array, axis: int = 1) -> jax.Array:
        """``image [.., L', ..]`` and ``text [.., T', ..]`` (tokens on ``axis``) → the joint
        ``[.., S', ..]`` in the shard-major order of the module docstring."""
        c = self.shards
        if c == 1:
            return jnp.concatenate([image, text], axis=axis)
        i = image.reshape(image.shape[:axis] + (c, -1) + image.shape[axis + 1:])
        t = text.reshape(text.shape[:axis] + (c, -1) + text.shape[axis + 1:])
        joint = jnp.concatenate([i, t], axis=axis + 1)
        return joint.reshape(image.shape[:axis] + (self.length,) + image.shape[axis + 1:])

    def split(self, joint: jax.Array, axis: int = 1) -> tuple[jax.Array, jax.Array]:
        """The inverse of :meth:`join`: ``(image [.., L', ..], text [.., T', ..])``."""
        c, ic = self.shards, self.image_padded // self.shards
        if c == 1:
            return (jax.lax.slice_in_dim(joint, 0, ic, axis=axis),
                    jax.lax.slice_in_dim(joint, ic, self.length, axis=axis))
        blocks = joint.reshape(joint.shape[:axis] + (c, -1) + joint.shape[axis + 1:])
        i = jax.lax.slice_in_dim(blocks, 0, ic, axis=axis + 1)
        t = jax.lax.slice_in_dim(blocks, ic, blocks.shape[axis + 1], axis=axis + 1)
        lead, rest = joint.shape[:axis], joint.shape[axis + 1:]
        return (i.reshape(lead + (self.image_padded,) + rest),
                t.reshape(lead + (self.text_padded,) + rest))

    def key_mask(self, batch: int, text_mask: Optional[jax.Array] = None):
        """The joint ``kv_mask [B, S']`` (True = attend): real image tokens, real text tokens
        (and where ``text_mask [B, T]`` says so); None when every key is real."""
        if text_mask is None and not self.padded:
            return None
        i = jnp.broadcast_to(jnp.arange(self.image_padded) < self.image,
                             (batch, self.image_padded))
        t = jnp.broadcast_to(jnp.arange(self.text_padded) < self.text,
                             (batch, self.text_padded))
        if text_mask is not None:
            t = t & self.pad(jnp.asarray(text_mask, bool), 1, image=False)
        return self.join(i, t)


def check_length_masks(layout: JointLayout, kernel: str, masked_text: bool,
                       ring: bool) -> None:
    """Raise :class:`~ditax.errors.RequestError` when ``kernel`` (the local kernel of the
    attention call; one of those taking key masks as lengths, valid keys first) would get a
    joint mask that is not a prefix: on more than one context shard, image padding or a text
    mask puts masked keys between valid ones (``ring``: the ring steps run a kernel that takes
    any mask, so nothing to refuse)."""
    if layout.shards == 1 or ring:
        return
    why = []
    if layout.image_padded != layout.image:
        why.append(f"{layout.image} image tokens are not a multiple of the {layout.shards} "
                   f"context shards")
    if masked_text:
        why.append("a text_mask is given")
    if why:
        raise RequestError(f"attention kernel {kernel!r} takes key masks as lengths (valid keys "
                           f"first), but the joint image + text sequence on {layout.shards} context shards "
                           f"would have masked keys between valid ones ({'; '.join(why)}); use an "
                           f"image size whose tokens divide by the shards and no text_mask, or "
                           f"a kernel that takes any mask (xla, blockwise, flash, splash)")


__all__ = ["JointLayout", "check_length_masks"]
