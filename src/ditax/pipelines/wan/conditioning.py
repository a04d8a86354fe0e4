"""What an image adds to a denoise step, as data the compiled step takes next to the latents.

A :class:`Condition` is a pytree of device arrays (None fields are absent leaves), built once
per request by :class:`~ditax.pipelines.wan.image_to_video.WanImageToVideo` and passed to every
step; text-to-video passes ``None`` and its step is unchanged. Two wirings, as Wan's
pipelines build them:

- channels (Wan 2.1 I2V / FLF2V, Wan 2.2 I2V A14B): the transformer reads
  ``[noise, mask, condition latents]`` concatenated on the channel axis, one timestep per
  sample; ``channels`` ``[1, tf + z, F, Y, X]`` is the mask (``tf`` = the VAE's temporal
  factor: one mask channel per frame of a latent frame) and the normalised latents of the
  condition video (the image, zeros, and the last image for first-last-frame);
  ``image`` ``[n, S, Di]`` the CLIP features where the transformer has ``image_dim``
  (``n`` = 1, or 2 for first-last-frame);
- expand (Wan 2.2 TI2V, ``expand_timesteps``): the first latent frame is replaced by the
  image's normalised latents before each forward (``frame_mask`` ``[1, 1, F, Y, X]``: 0 on that
  frame, 1 elsewhere; ``latent`` ``[1, z, 1, Y, X]``), its tokens run at t=0 (``token_mask``
  ``[1, L]``: the frame mask per token), and the same blend gives the final latents.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from ditax.models.wan.conditioning import replace_first_frame


@dataclass(frozen=True)
class Condition:
    """Image conditioning of one request (see the module docstring for the fields)."""

    channels: jax.Array | None = None
    image: jax.Array | None = None
    frame_mask: jax.Array | None = None
    latent: jax.Array | None = None
    token_mask: jax.Array | None = None


jax.tree_util.register_dataclass(
    Condition, data_fields=["channels", "image", "frame_mask", "latent", "token_mask"],
    meta_fields=[])


def blend_first_frame(cond: Condition, latents: jax.Array) -> jax.Array:
    """``(1 - mask) * latent + mask * latents``: the conditioning frame replaced (expand)."""
    return replace_first_frame(cond.frame_mask, cond.latent, latents)


def model_inputs(cond: Condition | None, latents: jax.Array, t: jax.Array, dtype):
    """What the transformer is fed at timestep ``t`` (float32 ``[]``, or ``[B]``: one per row
    of a continuous batch) for latents
    ``[B, z, F, Y, X]``: ``(x [B, C_in, F, Y, X] in dtype, timestep [B] or per token [B, L],
    image features or None)``."""
    b = latents.shape[0]
    if cond is None:
        return latents.astype(dtype), jnp.broadcast_to(t, (b,)), None
    x = latents
    if cond.frame_mask is not None:
        x = blend_first_frame(cond, x)
        per_row = jnp.reshape(t, (-1, 1))           # [] or [B] (rows at their own steps)
        timestep = jnp.broadcast_to(cond.token_mask * per_row, (b, cond.token_mask.shape[-1]))
    else:
        timestep = jnp.broadcast_to(t, (b,))
    if cond.channels is not None:
        x = jnp.concatenate([x, jnp.broadcast_to(cond.channels, (b, *cond.channels.shape[1:]))],
                            axis=1)
    return x.astype(dtype), timestep, cond.image


def final_latents(cond: Condition | None, latents: jax.Array) -> jax.Array:
    """The latents to decode: with an expand condition the first frame is the image's."""
    if cond is None or cond.frame_mask is None:
        return latents
    return blend_first_frame(cond, latents)


def batch_twice(image):
    """Image features for a forward of (cond, uncond) stacked on the batch: the same images
    for both halves (first-last pairs stay adjacent)."""
    return None if image is None else jnp.concatenate([image, image])


__all__ = ["Condition", "batch_twice", "blend_first_frame", "final_latents", "model_inputs"]
