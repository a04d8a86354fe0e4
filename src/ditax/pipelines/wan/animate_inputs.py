"""Wan 2.2 Animate's request inputs on the host and its rule for the denoiser's inputs.

- :class:`AnimateCondition`: one segment's condition — Wan I2V's channel condition (mask and
  latents of the reference frame and of the segment's condition video) and CLIP features, plus
  the pose latents and the face crops the Animate transformer reads;
- :func:`animate_inputs`: the :class:`~ditax.models.base.ModelInputs` rule of the generic
  loop (Wan's, plus ``pose_hidden_states`` / ``face_pixel_values``); its ``uncond``
  (:func:`blank_face`) is the classifier-free guidance branch's: the face crops all -1;
- :func:`pad_frames` (diffusers' "reflect" padding of a frame list to a length) and
  :func:`segment_mask` (the folded condition mask of a segment).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from ditax.pipelines.wan.conditioning import Condition, model_inputs
from ditax.io.images import nearest_indices


@dataclass(frozen=True)
class AnimateCondition:
    """``base`` (:class:`~ditax.pipelines.wan.conditioning.Condition`: ``channels`` ``[1, tf +
    z, F, Y, X]``, ``image`` CLIP features), ``pose`` ``[1, z, F - 1, Y, X]``, ``face``
    ``[1, 3, S, P, P]`` in [-1, 1]."""

    base: Condition
    pose: jax.Array
    face: jax.Array


jax.tree_util.register_dataclass(AnimateCondition, data_fields=["base", "pose", "face"],
                                 meta_fields=[])


def animate_inputs(model, condition, latents, t):
    """Wan's inputs (:func:`~ditax.pipelines.wan.inputs.wan_inputs`) plus the pose latents and
    face crops, each with the latents' batch."""
    dt = jnp.dtype(model.cfg.dtype)
    x, timestep, image = model_inputs(condition.base, latents, t, dt)
    b = latents.shape[0]
    grow = lambda a: jnp.broadcast_to(a, (b, *a.shape[1:])).astype(dt)  # noqa: E731
    return x, timestep, {"encoder_hidden_states_image": image,
                         "pose_hidden_states": grow(condition.pose),
                         "face_pixel_values": grow(condition.face)}


def blank_face(extras: dict) -> dict:
    """The unconditional branch's extras: the face crops all -1 (a blank face; diffusers'
    ``WanAnimatePipeline`` feeds ``face * 0 - 1`` with the negative prompt), the rest the
    same (:func:`ditax.pipelines.denoise.uncond_rule`)."""
    face = extras["face_pixel_values"]
    return {**extras, "face_pixel_values": jnp.full_like(face, -1)}


animate_inputs.uncond = blank_face


def final_animate_latents(cond, latents):
    """The latents to decode are the sampled ones (frame 0, the reference, is cut later)."""
    return latents


def pad_frames(frames: list, n: int) -> list:
    """``frames`` continued to ``n`` by walking back and forth over them (diffusers'
    ``pad_video_frames``: ``[1, 2, 3]`` → ``[1, 2, 3, 2, 1, 2, ...]``)."""
    out, i, step = [], 0, 1
    while len(out) < n:
        out.append(frames[i])
        if len(frames) > 1:
            if not 0 <= i + step < len(frames):
                step = -step
            i += step
    return out


def segment_mask(frames: int, grid, temporal: int, given: int, keep=None) -> np.ndarray:
    """The condition mask ``[1, tf, F', Y, X]`` of a segment of ``frames`` pixel frames: 1 on
    its first ``given`` frames (the previous segment's), else ``keep`` ``[frames, H, W]`` (1 =
    keep the background; replace mode; nearest-resized to the latent grid) or 0; the first frame
    stands for ``tf`` frames and each latent frame takes ``tf`` channels."""
    f, y, x = grid
    if keep is None:
        m = np.zeros((frames, y, x), np.float32)
    else:
        keep = np.asarray(keep, np.float32)
        m = keep[:, nearest_indices(keep.shape[1], y)][:, :, nearest_indices(keep.shape[2], x)]
        m = np.array(m)
    m[:given] = 1.0
    m = np.concatenate([np.repeat(m[:1], temporal, axis=0), m[1:]])       # [tf * F', Y, X]
    return np.ascontiguousarray(m.reshape(f, temporal, y, x).transpose(1, 0, 2, 3)[None])


__all__ = ["AnimateCondition", "animate_inputs", "blank_face", "final_animate_latents",
           "pad_frames", "segment_mask"]
