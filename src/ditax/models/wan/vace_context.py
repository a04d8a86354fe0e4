"""VACE's control inputs on the host and the control context the transformer reads, with the
arithmetic of diffusers' ``WanVACEPipeline`` (``preprocess_conditions``,
``prepare_video_latents``, ``prepare_masks``); the pipeline (:mod:`ditax.pipelines.wan.
vace_inputs`) and ``ditax preprocess`` (per training clip, :class:`~ditax.models.wan.family.
WanEncoders`) build it with these.

- ``video`` (control or source frames): ``num_frames`` frames of exactly ``height x width``
  (a list of PIL images / float ``[H, W, 3]`` arrays in [0, 1], or one ``[F, H, W, 3]`` array);
  none = zeros (mid-grey in [-1, 1]).
- ``mask``: the same frames, binary, white (1) = generate, black (0) = keep; none = all 1.
  Values within 0.1 of 0 or 1 (a compressed mask video) are snapped to it; others refused.
- ``reference_images``: each image is fitted inside ``height x width`` (aspect kept, bilinear,
  as torch's ``interpolate(align_corners=False)``) on a white canvas, encoded alone, and its
  latent frame (with zero "reactive" channels and a zero mask) goes before the video's — the
  last image first, as diffusers concatenates them.

The control context is ``[1, 2z + s^2, n + F', Y, X]``: the normalised latents of
``video * (1 - mask)`` (inactive) and ``video * mask`` (reactive), then the mask folded
``s x s`` (the VAE's spatial factor) into channels and resampled to the latent frames with
torch's ``nearest-exact`` rule.
"""

from __future__ import annotations

import numpy as np
import PIL.Image

from ditax.errors import RequestError
from ditax.io.images import MASK_SNAP as SNAP   # mask values this close to 0 or 1 are that value
from ditax.io.images import check_image, to_frame

VACE_PIPELINE = "WanVACEPipeline"   # the diffusers class of VACE pipeline folders


def _frames(frames, name: str, num_frames: int, height: int, width: int, fix: str) -> list:
    if isinstance(frames, (str, bytes)) or frames is None:
        raise RequestError(f"{name} must be a list of frames (PIL images or [H, W, 3] arrays "
                           f"in [0, 1]) or one [F, H, W, 3] array; got {type(frames).__name__}")
    arr = None if isinstance(frames, (list, tuple)) else np.asarray(frames)
    items = list(frames) if arr is None else list(arr)
    if len(items) != num_frames:
        raise RequestError(f"{name} has {len(items)} frames but the request makes num_frames="
                           f"{num_frames}; {fix}")
    for i, f in enumerate(items):
        size = (f.height, f.width) if isinstance(f, PIL.Image.Image) else np.shape(f)[:2]
        if tuple(size) != (height, width):
            raise RequestError(f"{name} frame {i} is {size[0]}x{size[1]} (HxW) but the request "
                               f"is {height}x{width}; resize the frames to {height}x{width} or "
                               f"ask for height={size[0]}, width={size[1]} (--height, --width)")
    return items


def video_frames(video, num_frames: int, height: int, width: int) -> np.ndarray:
    """``[3, F, H, W]`` float32 in [-1, 1] (zeros for no video)."""
    if video is None:
        return np.zeros((3, num_frames, height, width), np.float32)
    items = _frames(video, "video", num_frames, height, width,
                    f"pass {num_frames} frames, or num_frames (--frames) = the video's "
                    f"frame count if it is 4k+1")
    return np.stack([to_frame(f, height, width, f"video frame {i}")
                     for i, f in enumerate(items)], axis=1)


def mask_frames(mask, num_frames: int, height: int, width: int, video=True) -> np.ndarray:
    """``[F, H, W]`` float32 in {0, 1} (ones for no mask; 1 = generate); a mask needs a
    ``video`` (as diffusers)."""
    if mask is None:
        return np.ones((num_frames, height, width), np.float32)
    if video is None:
        raise RequestError("mask= needs video= (the frames it keeps or regenerates; CLI: "
                           "--mask with --video)")
    items = _frames(mask, "mask", num_frames, height, width,
                    "the mask needs one frame per video frame")
    out = []
    for i, f in enumerate(items):
        if isinstance(f, PIL.Image.Image):
            x = np.asarray(f.convert("L") if f.mode != "RGB" else f, np.float32) / 255.0
        else:
            x = np.asarray(f, np.float32)
            if not np.isfinite(x).all() or x.min() < 0 or x.max() > 1:
                raise RequestError(f"mask frame {i} spans [{x.min():g}, {x.max():g}]; a float "
                                   f"mask must be in [0, 1] (1 = generate, 0 = keep)")
        if x.ndim == 3:
            if x.shape[-1] != 3 or np.abs(x - x[..., :1]).max() > SNAP:
                raise RequestError(f"mask frame {i} has shape {x.shape} with differing "
                                   f"channels; pass a grey mask ([H, W] or equal R, G, B)")
            x = x[..., 0]
        snapped = np.round(x)
        bad = np.abs(x - snapped) > SNAP
        if bad.any():
            v = float(x[bad].flat[0])
            raise RequestError(f"mask frame {i} is not binary (a value {v:.3g}); the mask is "
                               f"white = generate, black = keep — threshold it (mask > 0.5)")
        out.append(snapped)
    return np.stack(out).astype(np.float32)


def _bilinear(x: np.ndarray, h: int, w: int) -> np.ndarray:
    """``[C, H0, W0]`` → ``[C, h, w]``, torch's bilinear ``align_corners=False`` (float32)."""
    def taps(n_in, n_out):
        scale = np.float32(n_in) / np.float32(n_out)
        src = np.maximum((np.arange(n_out, dtype=np.float32) + np.float32(0.5)) * scale
                         - np.float32(0.5), np.float32(0.0))
        i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
        i1 = np.minimum(i0 + 1, n_in - 1)
        lam = (src - i0).astype(np.float32)
        return i0, i1, lam

    if (x.shape[1], x.shape[2]) == (h, w):
        return x
    y0, y1, ly = taps(x.shape[1], h)
    x0, x1, lx = taps(x.shape[2], w)
    rows = x[:, y0] * (1 - ly)[None, :, None] + x[:, y1] * ly[None, :, None]
    return rows[:, :, x0] * (1 - lx) + rows[:, :, x1] * lx


def reference_frames(reference_images, height: int, width: int, spatial: int) -> list:
    """Each reference image as ``[3, H, W]`` float32 in [-1, 1] (module docstring)."""
    if reference_images is None:
        return []
    refs = reference_images if isinstance(reference_images, (list, tuple)) else [
        reference_images]
    out = []
    for j, image in enumerate(refs):
        name = f"reference_images[{j}]"
        image = check_image(image, name)
        h0, w0 = (image.height, image.width) if isinstance(image, PIL.Image.Image) \
            else image.shape[:2]
        h0, w0 = h0 - h0 % spatial, w0 - w0 % spatial
        if h0 < 1 or w0 < 1:
            raise RequestError(f"{name} is smaller than {spatial}x{spatial} pixels; pass a "
                               f"larger image")
        x = to_frame(image, h0, w0, name)
        scale = min(height / h0, width / w0)
        nh, nw = int(h0 * scale), int(w0 * scale)
        canvas = np.ones((3, height, width), np.float32)
        top, left = (height - nh) // 2, (width - nw) // 2
        canvas[:, top:top + nh, left:left + nw] = _bilinear(x, nh, nw)
        out.append(canvas)
    return out


def mask_channels(mask: np.ndarray, spatial: int, temporal: int, references: int) -> np.ndarray:
    """``[s*s, n + F', Y, X]``: the mask ``[F, H, W]`` folded ``s x s`` into channels
    (channel ``sy * s + sx``), resampled to ``F' = (F + tf - 1) // tf`` frames by torch's
    nearest-exact rule, after ``n`` zero frames for the references."""
    f, h, w = mask.shape
    y, x = h // spatial, w // spatial
    m = mask.reshape(f, y, spatial, x, spatial).transpose(2, 4, 0, 1, 3)
    m = m.reshape(spatial * spatial, f, y, x)
    out_f = (f + temporal - 1) // temporal
    scale = np.float32(f) / np.float32(out_f)
    src = np.minimum(np.floor((np.arange(out_f, dtype=np.float32) + np.float32(0.5)) * scale)
                     .astype(np.int64), f - 1)
    m = m[:, src]
    return np.concatenate([np.zeros((m.shape[0], references, y, x), np.float32), m], axis=1)


def control_context(vae, video: np.ndarray, mask: np.ndarray, references: list) -> np.ndarray:
    """``[1, 2z + s^2, n + F', Y, X]`` float32 (module docstring) from checked host inputs."""
    from ditax.models.wan.conditioning import encode_normalized

    m = mask[None]
    # one batched encode: the Wan VAE is causal, so a reference image as frame 0 of an
    # otherwise empty video has the latent frame 0 of that image encoded alone
    pad = np.zeros_like(video)
    batch = [video * (1.0 - m), video * m] + [
        np.concatenate([ref[:, None], pad[:, 1:]], axis=1) for ref in references]
    z = np.asarray(encode_normalized(vae, np.stack(batch)))      # [2 + n, z, F', Y, X]
    lat = np.concatenate([z[0], z[1]], axis=0)                   # inactive, reactive
    for j in range(len(references)):                             # each goes first
        r = z[2 + j][:, :1]                                      # [z, 1, Y, X]
        lat = np.concatenate([np.concatenate([r, np.zeros_like(r)], axis=0), lat], axis=1)
    ch = mask_channels(mask, vae.scale_factor_spatial, vae.scale_factor_temporal,
                       len(references))
    return np.concatenate([lat, ch], axis=0)[None]


def clip_context(vae, clip, control=None, mask=None, references=()) -> np.ndarray:
    """The control context ``[2z + s^2, n + F', Y, X]`` of one training clip ``[3, F, H, W]``
    in [-1, 1] (``ditax preprocess``) from its sidecars, as the pipeline builds it from the same
    ``video=`` / ``mask=`` / ``reference_images=``: ``control`` ``[3, F, H, W]`` in [-1, 1]
    (None: the clip itself when a ``mask`` is given — inpainting: keep the black part — else
    zeros), ``mask`` the same (a grey video; None: all generate), ``references`` images."""
    _, f, h, w = clip.shape
    if control is None and mask is not None:
        control = clip
    video = video_frames(None, f, h, w) if control is None else np.asarray(control, np.float32)
    if mask is not None:    # [-1, 1] channels-first -> [F, H, W, 3] in [0, 1]
        mask = np.clip((np.asarray(mask, np.float32) + 1.0) / 2.0, 0.0, 1.0).transpose(1, 2, 3, 0)
    m = mask_frames(mask, f, h, w)
    refs = reference_frames(list(references) or None, h, w, vae.scale_factor_spatial)
    return control_context(vae, video, m, refs)[0]


def with_references(latents, context) -> np.ndarray:
    """A clip's latents ``[z, F', Y, X]`` with the reference frames of its control ``context``
    ``[2z + s^2, n + F', Y, X]`` before them (their inactive latents: each image encoded
    alone): the ``n + F'`` frames the pipeline denoises, so training sees its latent layout."""
    z, n = latents.shape[0], context.shape[1] - latents.shape[1]
    return np.concatenate([np.asarray(context[:z, :n], np.float32),
                           np.asarray(latents, np.float32)], axis=1)


__all__ = ["SNAP", "VACE_PIPELINE", "clip_context", "with_references", "control_context", "mask_channels", "mask_frames", "reference_frames",
           "video_frames"]
