"""Image conditioning of Wan: the rules training, preprocessing and the pipelines share (the
pipelines build their condition from images with these: :mod:`ditax.pipelines.wan.image_to_video`).

- the folder kind (:func:`folder_kind`): what a pipeline folder's ``model_index.json`` says about
  its image condition — ``t2v``, ``i2v`` (channels) or ``ti2v`` (expand);

- ``channels`` (Wan I2V): each sample carries ``condition`` ``[tf + z, F, Y, X]`` — the
  first-frame mask folded into ``tf`` channels and the normalised latents of the condition
  video (first frame, zeros after), as ``ditax preprocess`` stores them — concatenated after
  the noisy latents; Wan 2.1 adds ``image`` ``[S, image_dim]``, the CLIP features of the first
  frame (first-last-frame models: both frames, ``S = pos_embed_seq_len``).
- ``expand`` (Wan 2.2 TI2V): the clean first latent frame replaces the noisy one, its tokens
  run at t=0 and it is left out of the loss (the model is not asked to denoise what it is
  given), as Wan 2.2 TI2V trains image-to-video.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

CLIP_TOKENS = 257   # CLIP ViT-H/14 at 224 px: one class token + 16 x 16 patches
I2V_PIPELINE = "WanImageToVideoPipeline"   # the diffusers class of image-to-video folders
FOLDER_KINDS = ("t2v", "i2v", "ti2v")


def folder_kind(index: dict) -> str:
    """The kind of a pipeline folder from its ``model_index.json`` ``index``: ``"ti2v"``
    (``expand_timesteps``: an optional image replaces the first latent frame, whose tokens run
    at t=0; either class), ``"i2v"`` (a :data:`I2V_PIPELINE`: an image is required — noise, mask
    and condition latents as transformer channels) or ``"t2v"`` (text only)."""
    if index.get("expand_timesteps"):
        return "ti2v"
    return "i2v" if index.get("_class_name") == I2V_PIPELINE else "t2v"


def condition_shapes(m, latent_shape) -> dict[str, tuple[int, ...]]:
    """Extra per-sample entries (name → shape) a model config ``m`` is trained with."""
    c, f, y, x = latent_shape
    out = {}
    if m.image_condition == "channels":
        out["condition"] = (m.in_channels - c, f, y, x)
    if m.image_dim is not None:
        out["image"] = (m.pos_embed_seq_len or CLIP_TOKENS, m.image_dim)
    return out


def model_input(m, latents, condition):
    """``(transformer input [B, C_in, F, Y, X], image features or None)``."""
    x = latents
    if m.image_condition == "channels":
        x = jnp.concatenate([latents, condition["condition"].astype(latents.dtype)], axis=1)
    image = None if m.image_dim is None else condition["image"]
    return x, image


def training_inputs(m, x_t, x0, timestep):
    """``(noisy input, timestep [B] or per token [B, L], loss mask or None)``: the expand
    condition's replacement, per-token timesteps and loss mask (module docstring)."""
    if m.image_condition != "expand":
        return x_t, timestep, None
    frame, per_token = first_frame_masks(x0.shape[2:], m.patch_size)     # [F], [L]
    mask = jnp.asarray(frame)[None, None, :, None, None].astype(x_t.dtype)   # [1, 1, F, 1, 1]
    x_in = replace_first_frame(mask, x0, x_t)
    return x_in, jnp.asarray(per_token)[None, :] * timestep[:, None], mask


def first_frame_masks(grid, patch_size) -> tuple[np.ndarray, np.ndarray]:
    """The expand condition's masks for a latent ``grid`` ``(F, Y, X)`` and the transformer's
    ``patch_size`` ``(pt, ph, pw)``: per latent frame ``[F]`` float32 (0 on frame 0, the given
    image; 1 after) and per token ``[L]`` float32 (the same for each token of the patch grid:
    the timestep factor, 0 = runs at t=0)."""
    f, y, x = grid
    pt, ph, pw = patch_size
    frame = (np.arange(f) > 0).astype(np.float32)
    return frame, np.repeat(frame[::pt], (y // ph) * (x // pw))


def replace_first_frame(mask, given, latents):
    """``(1 - mask) * given + mask * latents``: the given frame where ``mask`` is 0 (expand)."""
    return (1 - mask) * given + mask * latents


# ----------------------------------------------------------------------------------------------
# building a condition from frames (the pipelines and `ditax preprocess` share these)


def encode_normalized(vae, video) -> jnp.ndarray:
    """Normalised posterior mean ``[1, z, F', Y, X]`` float32 of a video ``[1, 3, F, H, W]``
    in [-1, 1] (encoded in the VAE's dtype, normalised in float32 as Wan's pipelines do)."""
    z = vae.encode(jnp.asarray(video, vae.dtype))
    return vae.normalize_latents(jnp.asarray(z, jnp.float32))


def frame_mask_channels(given: np.ndarray, temporal: int, grid) -> np.ndarray:
    """``[1, tf, F', Y, X]`` float32 from ``given`` ``[F]`` (1 = a frame the user gave): the
    first frame stands for the ``tf`` frames of latent frame 0, then ``tf`` channels per
    latent frame, ``mask[c, f] = given'[f * tf + c]``."""
    f, y, x = grid
    per_frame = np.concatenate([np.repeat(given[:1], temporal), given[1:]])
    mask = per_frame.reshape(f, temporal).T
    return np.ascontiguousarray(np.broadcast_to(mask[None, :, :, None, None],
                                                (1, temporal, f, y, x)), np.float32)


def channel_condition(vae, first, last, num_frames: int) -> jnp.ndarray:
    """Wan I2V's ``[1, tf + z, F', Y, X]``: the mask and the normalised latents of the video
    ``[first, zeros..., last]`` (``last`` None: zeros to the end). ``first`` / ``last``:
    ``[3, H, W]`` float32 in [-1, 1]."""
    _, h, w = first.shape
    video = np.zeros((1, 3, num_frames, h, w), np.float32)
    video[0, :, 0] = first
    given = np.zeros(num_frames, np.float32)
    given[0] = 1.0
    if last is not None:
        video[0, :, -1] = last
        given[-1] = 1.0
    latents = encode_normalized(vae, video)
    mask = frame_mask_channels(given, vae.scale_factor_temporal,
                               vae.config.latent_grid(num_frames, h, w))
    return jnp.concatenate([jnp.asarray(mask), latents], axis=1)


def clip_features(encoder, processor, images) -> jnp.ndarray:
    """CLIP penultimate features ``[n, S, Di]`` of the images (PIL / float ``[H, W, 3]`` in
    [0, 1]), preprocessed with the folder's ``CLIPImageProcessor`` settings."""
    from ditax.models.encoders.clip import encode_image

    return encode_image(encoder, list(images), processor)


__all__ = ["CLIP_TOKENS", "FOLDER_KINDS", "I2V_PIPELINE", "channel_condition", "clip_features",
           "condition_shapes", "encode_normalized", "first_frame_masks", "folder_kind",
           "frame_mask_channels", "model_input", "replace_first_frame", "training_inputs"]
