"""Wan 2.2 Animate pipeline (diffusers ``WanAnimatePipeline``): a character image driven by a
pose video and a face video (``mode="animate"``), or put into a background video where a mask
says (``mode="replace"``), in segments of ``segment_frame_length`` frames.

The inputs are prepared outside ditax (the upstream preprocessing uses its own detectors):
``pose_video`` the rendered skeleton frames at the output size, ``face_video`` the face crops
(resized to the transformer's ``motion_encoder_size``), for ``replace`` the ``background_video``
(the source with the person removed) and ``mask_video`` (white = the person's region,
generated; black = background kept). Each is a list of PIL images or float ``[H, W, 3]``
frames in [0, 1] (the mask: grey or RGB, 0 / 1).

Per segment (``start`` advancing by ``segment_frame_length - prev_segment_conditioning_frames``;
pose / face / background / mask reflect-padded to whole segments) the generic loop
(:func:`~ditax.pipelines.sampling.sample`) denoises latents ``[1, z, 1 + F', Y, X]`` (frame 0
the reference image) with Wan I2V's channel condition — the reference image's latents (mask 1),
then the segment's condition video (the previous segment's last decoded frames, mask 1, then
zeros; ``replace``: the background, mask ``1 - mask_video``) — the CLIP features of the image,
the pose latents and the face crops. Frames 1.. are decoded; segments after the first drop
their ``prev_segment_conditioning_frames`` overlap; the video is cut to the pose video's length.

Classifier-free guidance (``guidance_scale > 1``; diffusers' default 1.0 runs without it) is
diffusers': the unconditional branch takes the negative prompt and a blank face (every crop
pixel -1; :func:`~ditax.pipelines.wan.animate_inputs.blank_face`), the same image, pose and
condition.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ditax.errors import RequestError
from ditax.phases import phase
from ditax.pipelines.programs import in_compile_cache
from ditax.io.frames import unit_pixels
from ditax.pipelines.sampling import Timings
from ditax.pipelines.wan.animate_inputs import (AnimateCondition, animate_inputs,
                                                final_animate_latents, pad_frames, segment_mask)
from ditax.pipelines.wan.conditioning import Condition
from ditax.pipelines.wan.image_to_video import WanImageToVideo
from ditax.io.images import check_image, to_frame

MODES = ("animate", "replace")
GUIDANCE_SCALE = 1.0   # diffusers' WanAnimatePipeline default: no classifier-free guidance


def _frames(video, name: str) -> list:
    if video is None:
        return None
    if isinstance(video, np.ndarray) and video.ndim == 4:
        video = list(video)
    if not isinstance(video, (list, tuple)) or not video:
        raise RequestError(f"{name} must be a non-empty list of frames (PIL images or float "
                           f"[H, W, 3] arrays in [0, 1]); got {type(video).__name__}")
    return [check_image(f, f"{name} frame {i}") for i, f in enumerate(video)]


def _mask_frame(frame, height: int, width: int) -> np.ndarray:
    """A mask frame as ``[height, width]`` float32 in [0, 1] (grey)."""
    import PIL.Image

    if isinstance(frame, PIL.Image.Image):
        g = frame.convert("L").resize((width, height), resample=PIL.Image.LANCZOS,
                                      reducing_gap=None)
        return np.asarray(g, np.float32) / np.float32(255.0)
    return (to_frame(frame, height, width, "mask_video frame")[0] + 1.0) / 2.0


class WanAnimate(WanImageToVideo):
    """A loaded Wan 2.2 Animate pipeline (``WanAnimatePipeline`` folders; module docstring)."""

    batches = False   # its call runs the loop once per segment: requests run one by one
    hands_frames = False   # its segments decode whole (the next segment reads their frames)

    def check_animate(self, image, pose, face, background, mask, mode, segment_frame_length,
                      prev) -> None:
        """Refuse, in one line naming the value, what this pipeline cannot take."""
        if pose is None:
            raise RequestError("Wan Animate needs pose_video= (the rendered pose frames at the "
                               "output size; CLI --pose-video POSE.mp4)")
        if face is None:
            raise RequestError("Wan Animate needs face_video= (the face crops, one per pose "
                               "frame; CLI --face-video FACE.mp4)")
        if image is None:
            raise RequestError("Wan Animate needs image= (the character; CLI --image)")
        if mode not in MODES:
            raise RequestError(f"mode={mode!r} must be 'animate' or 'replace'")
        if mode == "replace" and (background is None or mask is None):
            raise RequestError("mode='replace' needs background_video= and mask_video=")
        if mode == "animate" and (background is not None or mask is not None):
            raise RequestError("background_video= / mask_video= are for mode='replace'; drop "
                               "them or set mode='replace'")
        tf = self.vae.scale_factor_temporal
        if (not isinstance(segment_frame_length, int) or segment_frame_length < tf + 1
                or (segment_frame_length - 1) % tf):
            raise RequestError(f"segment_frame_length={segment_frame_length!r} must be of the "
                               f"form {tf}k+1 with k >= 1 (e.g. 77)")
        if not isinstance(prev, int) or not 1 <= prev < segment_frame_length:
            raise RequestError(f"prev_segment_conditioning_frames={prev!r} must be an int in "
                               f"1..{segment_frame_length - 1} (1 or 5 as upstream)")

    @in_compile_cache
    def __call__(self, image=None, pose_video=None, face_video=None, background_video=None,
                 mask_video=None, prompt=None, negative_prompt=None, height: int | None = None,
                 width: int | None = None, segment_frame_length: int = 77,
                 num_inference_steps: int = 20, mode: str = "animate",
                 prev_segment_conditioning_frames: int = 1,
                 guidance_scale: float = GUIDANCE_SCALE,
                 seed: int = 0, latents=None, progress: bool = True,
                 max_sequence_length: int | None = None, cache: str | None = None,
                 cache_threshold: float | None = None, cfg_cache: bool = False,
                 cache_coefficients=None):
        """One video ``[F, H, W, 3]`` in [0, 1], ``F = len(pose_video)`` (module docstring);
        ``latents``: the first segment's initial noise ``[1, z, 1 + F', Y, X]`` (later
        segments draw theirs from ``seed``). ``height`` / ``width`` default to the image's.
        ``cache`` / ``cache_threshold`` / ``cfg_cache`` / ``cache_coefficients``: step caching
        as in text-to-video (:mod:`ditax.pipelines.cache.step_cache`; the cached step gets the
        pose latents and face crops as the plain one), per segment."""
        pose, face = _frames(pose_video, "pose_video"), _frames(face_video, "face_video")
        bg, mask = _frames(background_video, "background_video"), _frames(mask_video,
                                                                          "mask_video")
        prev = prev_segment_conditioning_frames
        self.check_animate(image, pose, face, bg, mask, mode, segment_frame_length, prev)
        image = check_image(image, "image")
        ih, iw = (image.height, image.width) if hasattr(image, "height") else image.shape[:2]
        height, width = height or ih, width or iw
        if (ih, iw) != (height, width):
            raise RequestError(f"image is {iw}x{ih} but the video is {width}x{height}; resize "
                               f"the character image to the output size")
        from ditax.pipelines.wan.request import check_request

        sf = self.vae.scale_factor_spatial * self.transformer.config.patch_size[1]
        check_request(prompt, height, width, segment_frame_length, num_inference_steps,
                      guidance_scale, None, negative_prompt, spatial=sf,
                      temporal=self.vae.scale_factor_temporal, seed=seed)
        n, seg = len(pose), segment_frame_length
        eff = seg - prev
        target = n + (-(n - prev)) % eff
        pose, face = pad_frames(pose, target), pad_frames(face, target)
        p = self.transformer.config.motion_encoder_size
        to = lambda fr, h, w, nm: np.stack([to_frame(f, h, w, nm) for f in fr], 1)  # noqa: E731
        pose = to(pose, height, width, "pose_video frame")                  # [3, T, H, W]
        face = to(face, p, p, "face_video frame")[None]                      # [1, 3, T, P, P]
        if mode == "replace":
            bg = to(pad_frames(bg, target), height, width, "background_video frame")
            keep = 1.0 - np.stack([_mask_frame(m, height, width)
                                   for m in pad_frames(mask, target)])      # [T, H, W]
        request = Segments(image, pose, face, bg if mode == "replace" else None,
                           keep if mode == "replace" else None, n, seg, prev)
        return self._segments(
            request, lambda use_cfg: self.encode_text(prompt, negative_prompt, use_cfg,
                                                     max_sequence_length),
            num_inference_steps, guidance_scale, seed, latents, progress,
            dict(cache=cache, cache_threshold=cache_threshold, cfg_cache=cfg_cache,
                 cache_coefficients=cache_coefficients))

    def _segments(self, request: "Segments", text, steps, guidance_scale, seed, latents,
                  progress, caching):
        """The loop once per segment of ``request`` (module docstring); ``text(use_cfg)``: the
        prompt's embeddings, encoded once."""
        from ditax.models.wan.conditioning import clip_features, encode_normalized

        r = request
        image, pose, face, bg, keep, n, seg, prev = (r.image, r.pose, r.face, r.background,
                                                     r.keep, r.frames, r.length, r.overlap)
        vae, tf = self.vae, self.vae.scale_factor_temporal
        _, _, height, width = pose.shape
        grid = vae.config.latent_grid(seg, height, width)                    # (F', Y, X)
        shape = (1, vae.z_dim, grid[0] + 1, grid[1], grid[2])
        # whole or in tiles, before any work (a decode that cannot fit is refused here)
        decoding = self.decode_options((1, vae.z_dim, *grid))
        t0 = time.perf_counter()
        with phase("text"):
            emb = jax.block_until_ready(text(guidance_scale > 1.0))
        t1 = time.perf_counter()
        with phase("image"):
            clip = clip_features(self.image_encoder, self.image_processor, [image])
            clip = clip.astype(self.dtype)
            ref = to_frame(image, height, width, "image")[None, :, None]
            ref = jax.block_until_ready(jnp.concatenate(
                [jnp.asarray(segment_mask(1, (1,) + grid[1:], tf, 1)),
                 encode_normalized(vae, ref)], axis=1))                       # [1, tf+z, 1, ..]
        # the whole call's seconds per phase (the segments' summed)
        spent = dict(text=t1 - t0, image=time.perf_counter() - t1, compile=0.0, denoise=0.0,
                     decode=0.0)
        out, frames = [], None
        for seg_i in range((n + (-(n - prev)) % (seg - prev)) // (seg - prev)):
            start = seg_i * (seg - prev)
            end = start + seg

            def condition(start=start, end=end, frames=frames):
                """This segment's :class:`AnimateCondition` (timed as the ``image`` phase)."""
                if start == 0:
                    head = bg[:, :prev] if bg is not None else np.zeros(
                        (3, prev, height, width), np.float32)
                else:
                    head = frames[:, -prev:]
                rest = (bg[:, start + prev:end] if bg is not None
                        else np.zeros((3, seg - prev, height, width), np.float32))
                cond_video = np.concatenate([head, rest], axis=1)[None]
                mask = segment_mask(seg, grid, tf, prev if start > 0 else 0,
                                    None if keep is None else keep[start:end])
                cond = jnp.concatenate([jnp.asarray(mask), encode_normalized(vae, cond_video)],
                                       1)
                return AnimateCondition(
                    base=Condition(channels=jnp.concatenate([ref, cond], axis=2), image=clip),
                    pose=encode_normalized(vae, pose[None, :, start:end]),
                    face=face[:, :, start:end])

            noise = latents if (start == 0 and latents is not None) else segment_noise(
                seed, seg_i, shape)
            res = self.prepared(
                experts=self.experts()[:1], inputs=animate_inputs, scheduler=self.scheduler,
                latent_shape=shape, num_inference_steps=steps, guidance_scale=guidance_scale,
                text=lambda use_cfg: emb, condition=condition, condition_phase="image",
                finalize=final_animate_latents, latents=noise, seed=seed, **caching,
                size=f"for a segment of {seg} frames at {height}x{width}").run(progress)
            for k in ("image", "compile", "denoise"):
                spent[k] += res.timings[k]
            t0 = time.perf_counter()
            with phase("decode"):      # raw frames: the next segment's condition reads them
                z = vae.denormalize_latents(jnp.asarray(res.output[:, :, 1:], vae.dtype))
                frames = np.asarray(self.vae_decode(z, **decoding), np.float32)[0]
            spent["decode"] += time.perf_counter() - t0
            out.append(frames if start == 0 else frames[:, prev:])
            self.last_stats, self.timings = res.stats, Timings(load=self.load_time, **spent)
        return unit_pixels(np.concatenate(out, axis=1)[None, :, :n])


@dataclass(frozen=True)
class Segments:
    """A request's frames laid out for its segments: the character ``image``, ``pose``
    ``[3, T, H, W]`` and ``face`` ``[1, 3, T, P, P]`` padded to whole segments (``T``),
    ``background`` ``[3, T, H, W]`` and ``keep`` ``[T, H, W]`` (1 - the mask) in ``replace``
    mode (else None); ``frames``: the output's, ``length``: a segment's,
    ``overlap``: the previous segment's last frames that condition the next."""

    image: Any
    pose: np.ndarray
    face: np.ndarray
    background: np.ndarray | None
    keep: np.ndarray | None
    frames: int
    length: int
    overlap: int


def segment_noise(seed: int, segment: int, shape) -> jax.Array:
    """Segment ``segment``'s initial noise: N(0, 1) from ``PRNGKey(seed)`` folded with the
    segment index (segment 0: exactly :func:`~ditax.pipelines.sampling.initial_noise`)."""
    from ditax.pipelines.sampling import initial_noise

    if segment == 0:
        return initial_noise(seed, shape)
    key = jax.random.fold_in(jax.random.PRNGKey(int(seed)), segment)
    return jax.random.normal(key, (int(np.prod(shape)),), jnp.float32).reshape(shape)


__all__ = ["GUIDANCE_SCALE", "MODES", "Segments", "WanAnimate", "segment_noise"]
