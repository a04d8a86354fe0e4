"""Wan's inputs beyond its request fields (files and their knobs) and how they become the
pipeline call: ``image`` / ``last_image`` (image-to-video, first-last frame), ``video`` /
``strength`` (video-to-video), VACE's ``mask`` / ``reference_image`` / ``conditioning_scale``,
Wan 2.2 Animate's ``pose_video`` / ``face_video`` / ``mode`` / ``background_video`` /
``mask_video`` / ``segment_frame_length`` / ``prev_segment_frames``, the low-noise expert's
``lora_2``.

The family declares them as data (:data:`INPUTS`; ``ditax generate`` shows each as a flag) and
reads them from the request's plain mapping (:func:`read`), so no entry knows a Wan input. Each
file is read and checked before any weights (an unreadable or unfit file is a
:class:`~ditax.errors.RequestError`: exit 2 / HTTP 400); the folder's preflight checks them
against it.
"""

from __future__ import annotations

from ditax.errors import RequestError
from ditax.pipelines.inputs import Input

# Wan Animate's inputs (the request's name -> the WanAnimate call's argument)
ANIMATE_FLAGS = {"pose_video": "pose_video", "face_video": "face_video", "mode": "mode",
                 "background_video": "background_video", "mask_video": "mask_video",
                 "segment_frame_length": "segment_frame_length",
                 "prev_segment_frames": "prev_segment_conditioning_frames"}

INPUTS = (
    Input("image", "first frame (image-to-video folders; optional for Wan 2.2 TI2V)",
          metavar="FIRST.png"),
    Input("last_image", "last frame (first-last-frame models, Wan 2.2 I2V A14B)",
          metavar="LAST.png"),
    Input("video", "source video: video-to-video with --strength (text-to-video folders)",
          metavar="IN.mp4"),
    Input("strength", "video-to-video: how much of the schedule runs, in (0, 1] (0.7)",
          kind="float"),
    Input("mask", "VACE folders: binary mask video, one frame per control video frame "
          "(white = generate, black = keep)", metavar="MASK.mp4"),
    Input("reference_image", "VACE folders: reference image (repeatable), fitted on a white "
          "frame before the video", metavar="REF.png", aliases=("--reference",), repeat=True),
    Input("conditioning_scale", "VACE folders: scale of the control hints (1.0)", kind="float",
          metavar="S"),
    Input("lora_2", "LoRA for the low-noise expert transformer_2 (Wan 2.2; repeatable)",
          metavar="FILE[:STRENGTH]", repeat=True),
    Input("pose_video", "Wan Animate folders: the rendered pose frames at the output size "
          "(with --image REF and --face-video; the video's length)", metavar="POSE.mp4"),
    Input("face_video", "Wan Animate folders: one face crop per pose frame",
          metavar="FACE.mp4"),
    Input("mode", "Wan Animate folders: animate the image, or replace the person in "
          "--background-video where --mask-video is white (animate)",
          choices=("animate", "replace")),
    Input("background_video", "Wan Animate --mode replace: the source with the person removed",
          metavar="BG.mp4"),
    Input("mask_video", "Wan Animate --mode replace: white = the person's region (generated)",
          metavar="MASK.mp4"),
    Input("segment_frame_length", "Wan Animate folders: frames per segment, 4k+1 (77)",
          kind="int", metavar="N"),
    Input("prev_segment_frames", "Wan Animate folders: frames a segment takes from the one "
          "before (1)", kind="int", metavar="N"),
)


def read_loras_2(given, family: str = "wan") -> list:
    """``lora_2`` (``FILE[:STRENGTH]`` each: the low-noise expert's LoRAs) read and checked as
    ``lora`` is (``lora_strict``), named by the family's LoRA names."""
    from ditax.lora import parse_lora_arg, resolve_loras
    from ditax.models import registry

    specs = given.get("lora_2") or []
    if not specs:
        return []
    return resolve_loras([parse_lora_arg(s) for s in specs], given.get("lora_strict", True),
                         names=registry.spec(family).lora_names_object())


def read(given, call: dict, sample, check) -> dict:
    """``call`` with Wan's inputs of ``given`` (the request's mapping) read into it
    (``sample``: the config's ``sample`` section; ``check``: the family's request check, run
    again where a source video sets the size)."""
    call.update(read_images(given.get("image"), given.get("last_image")))
    call.update(read_control(given))
    call.update(read_source_video(given, call, check))
    return read_animate(given, call, sample)


def read_images(image: str | None, last_image: str | None) -> dict:
    """``--image`` / ``--last-image`` files read into ``image=`` / ``last_image=`` (an
    unreadable file is a :class:`RequestError`: exit 2)."""
    from ditax.io.images import read_image

    if last_image is not None and image is None:
        raise RequestError("--last-image needs --image (the first frame) too")
    out = {}
    if image is not None:
        out["image"] = read_image(image, "--image")
    if last_image is not None:
        out["last_image"] = read_image(last_image, "--last-image")
    return out


def read_source_video(given, call: dict, check) -> dict:
    """``--video`` read into ``video=`` (float ``[F, H, W, 3]`` in [0, 1]; ``--frames N``: its
    first N) with ``strength=``; the request's size and frame count become the video's where
    ``--height`` / ``--width`` / ``--frames`` are not given, and are checked again
    (``check``: the family's request check)."""
    import numpy as np

    from ditax.io.video import read_video

    video, strength = given.get("video"), given.get("strength")
    if video is None:
        if strength is not None:
            raise RequestError("--strength is video-to-video; give the source with --video IN.mp4")
        return {}
    frames = read_video(video)
    wanted = given.get("num_frames")
    if wanted is not None:
        if len(frames) < wanted:
            raise RequestError(f"--video {video} has {len(frames)} frames, fewer than --frames "
                               f"{wanted}; lower --frames (4k+1)")
        frames = frames[:wanted]
    call.update(num_frames=len(frames), height=given.get("height") or frames.shape[1],
                width=given.get("width") or frames.shape[2])
    try:
        check(call["prompt"], call["height"], call["width"], call["num_frames"],
              call["num_inference_steps"], call["guidance_scale"])
    except ValueError as e:         # RequestError, or a ValueError of a check
        raise RequestError(f"--video {video} ({frames.shape[2]}x{frames.shape[1]}, "
                           f"{len(frames)} frames): {e}") from None
    out = {"video": frames.astype(np.float32) / np.float32(255.0)}
    if strength is not None:
        out["strength"] = strength
    return out


def read_control(given) -> dict:
    """VACE's ``--mask`` (frames in [0, 1]) / ``--reference-image`` / ``--conditioning-scale``
    as call arguments; the folder's preflight checks them against it and the request."""
    from ditax.io.images import read_image
    from ditax.io.video import read_video

    out, refs = {}, given.get("reference_image")
    if refs:
        out["reference_images"] = [read_image(r, "--reference-image") for r in refs]
    if given.get("mask") is not None:
        out["mask"] = read_video(given["mask"]) / 255.0
    if given.get("conditioning_scale") is not None:
        out["conditioning_scale"] = given["conditioning_scale"]
    return out


def read_animate(given, call: dict, s) -> dict:
    """Wan Animate's flags as its call (``pose_video=`` ... frames in [0, 1]); without any,
    ``call`` unchanged. The call has the Animate pipeline's keys only: its length is the pose
    video's (``--frames`` refused), ``--guidance`` defaults to diffusers' 1 (no CFG; above 1
    the unconditional branch takes ``--negative-prompt`` and a blank face), ``--height`` /
    ``--width`` to the image's; step caching (``sample.cache*``) passes through; the folder's
    preflight checks the rest."""
    from ditax.io.video import read_video
    from ditax.pipelines.wan.animate import GUIDANCE_SCALE

    animate = {k: given.get(k) for k in ANIMATE_FLAGS}
    animate = {k: v for k, v in animate.items() if v is not None}
    if not animate:
        return call
    bad = [f for f, v in (("--frames", given.get("num_frames")),
                          ("--guidance-2", given.get("guidance_scale_2")),
                          ("sample.sigmas", s.sigmas)) if v is not None]
    if bad:
        raise RequestError(f"{bad[0]} is not taken by Wan Animate (--pose-video given; the "
                           f"video is the pose video's length); drop it")
    out = {k: call[k] for k in ("prompt", "negative_prompt", "num_inference_steps", "seed",
                                "image", "last_image", "video", "mask", "reference_images",
                                "conditioning_scale", "strength", "cache", "cache_threshold",
                                "cfg_cache", "cache_coefficients") if k in call}
    guidance = given.get("guidance_scale")
    out["guidance_scale"] = guidance if guidance is not None else GUIDANCE_SCALE
    for key, v in animate.items():
        out[ANIMATE_FLAGS[key]] = read_video(v) / 255.0 if key.endswith("_video") else v
    img = out.get("image")
    size = (img.height, img.width) if hasattr(img, "height") else (call["height"], call["width"])
    out["height"] = given["height"] if given.get("height") is not None else size[0]
    out["width"] = given["width"] if given.get("width") is not None else size[1]
    return out


__all__ = ["ANIMATE_FLAGS", "INPUTS", "read", "read_control", "read_images", "read_loras_2",
           "read_source_video"]
