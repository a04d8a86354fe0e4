"""Wan's input flags of ``ditax generate`` (files and their knobs) and how they become the
pipeline call: ``--image`` / ``--last-image`` (image-to-video, first-last frame), ``--video`` /
``--strength`` (video-to-video), VACE's ``--mask`` / ``--reference-image`` /
``--conditioning-scale``, Wan 2.2 Animate's ``--pose-video`` / ``--face-video`` / ``--mode`` /
``--background-video`` / ``--mask-video`` / ``--segment-frame-length`` / ``--prev-segment-frames``.

The family declares them (:meth:`~ditax.pipelines.family.PipelineFamily.add_cli_inputs`,
:meth:`~ditax.pipelines.family.PipelineFamily.read_cli_inputs`), so ``ditax generate`` knows no
Wan flag: it adds every family's and refuses those the folder's family does not take. Each file
is read and checked before any weights (an unreadable or unfit file is a
:class:`~ditax.errors.RequestError`: exit 2); the folder's preflight checks them against it.
"""

from __future__ import annotations

import argparse

from ditax.errors import RequestError
from ditax.pipelines.request import add_flag

# Wan Animate's flags (argparse name -> the WanAnimate call's argument)
ANIMATE_FLAGS = {"pose_video": "pose_video", "face_video": "face_video", "mode": "mode",
                 "background_video": "background_video", "mask_video": "mask_video",
                 "segment_frame_length": "segment_frame_length",
                 "prev_segment_frames": "prev_segment_conditioning_frames"}


def add_arguments(p: argparse.ArgumentParser, family: str = "wan") -> None:
    """Wan's input flags on ``ditax generate``'s parser (all default None: not given); a flag
    another family added already is kept as it is."""
    add_flag(p, family, "--image", default=None, metavar="FIRST.png",
                   help="first frame (image-to-video folders; optional for Wan 2.2 TI2V)")
    add_flag(p, family, "--last-image", default=None, metavar="LAST.png",
                   help="last frame (first-last-frame models, Wan 2.2 I2V A14B)")
    add_flag(p, family, "--video", default=None, metavar="IN.mp4",
                   help="source video: video-to-video with --strength (text-to-video folders)")
    add_flag(p, family, "--strength", type=float, default=None,
                   help="video-to-video: how much of the schedule runs, in (0, 1] (0.7)")
    add_flag(p, family, "--mask", default=None, metavar="MASK.mp4",
                   help="VACE folders: binary mask video, one frame per control video frame "
                        "(white = generate, black = keep)")
    add_flag(p, family, "--reference-image", "--reference", action="append", default=[],
                   metavar="REF.png", help="VACE folders: reference image (repeatable), "
                   "fitted on a white frame before the video")
    add_flag(p, family, "--conditioning-scale", type=float, default=None, metavar="S",
                   help="VACE folders: scale of the control hints (1.0)")
    add_flag(p, family, "--lora-2", action="append", default=[], metavar="FILE[:STRENGTH]",
             help="LoRA for the low-noise expert transformer_2 (Wan 2.2; repeatable)")
    add_animate_arguments(p, family)


def add_animate_arguments(p: argparse.ArgumentParser, family: str = "wan") -> None:
    """The Animate flags on ``ditax generate``'s parser (all default None: not given)."""
    add_flag(p, family, "--pose-video", default=None, metavar="POSE.mp4",
                   help="Wan Animate folders: the rendered pose frames at the output size "
                        "(with --image REF and --face-video; the video's length)")
    add_flag(p, family, "--face-video", default=None, metavar="FACE.mp4",
                   help="Wan Animate folders: one face crop per pose frame")
    add_flag(p, family, "--mode", default=None, choices=("animate", "replace"),
                   help="Wan Animate folders: animate the image, or replace the person in "
                        "--background-video where --mask-video is white (animate)")
    add_flag(p, family, "--background-video", default=None, metavar="BG.mp4",
                   help="Wan Animate --mode replace: the source with the person removed")
    add_flag(p, family, "--mask-video", default=None, metavar="MASK.mp4",
                   help="Wan Animate --mode replace: white = the person's region (generated)")
    add_flag(p, family, "--segment-frame-length", type=int, default=None, metavar="N",
                   help="Wan Animate folders: frames per segment, 4k+1 (77)")
    add_flag(p, family, "--prev-segment-frames", type=int, default=None, metavar="N",
                   help="Wan Animate folders: frames a segment takes from the one before (1)")


def read_loras_2(args, family: str = "wan") -> list:
    """``--lora-2 FILE[:STRENGTH]`` (the low-noise expert's LoRAs) read and checked as
    ``--lora`` is (``--lora-strict``), named by the family's LoRA names."""
    from ditax.lora import parse_lora_arg, resolve_loras
    from ditax.models import registry

    specs = getattr(args, "lora_2", None) or []
    if not specs:
        return []
    return resolve_loras([parse_lora_arg(s) for s in specs], getattr(args, "lora_strict", True),
                         names=registry.spec(family).lora_names_object())


def read(args, call: dict, sample, check) -> dict:
    """``call`` with Wan's input flags of ``args`` read into it (``sample``: the config's
    ``sample`` section; ``check``: the family's request check, run again where a source video
    sets the size)."""
    call.update(read_images(getattr(args, "image", None), getattr(args, "last_image", None)))
    call.update(read_control(args))
    call.update(read_source_video(args, call, check))
    return read_animate(args, call, sample)


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


def read_source_video(args, call: dict, check) -> dict:
    """``--video`` read into ``video=`` (float ``[F, H, W, 3]`` in [0, 1]; ``--frames N``: its
    first N) with ``strength=``; the request's size and frame count become the video's where
    ``--height`` / ``--width`` / ``--frames`` are not given, and are checked again
    (``check``: the family's request check)."""
    import numpy as np

    from ditax.io.video import read_video

    video, strength = getattr(args, "video", None), getattr(args, "strength", None)
    if video is None:
        if strength is not None:
            raise RequestError("--strength is video-to-video; give the source with --video IN.mp4")
        return {}
    frames = read_video(video)
    if args.frames is not None:
        if len(frames) < args.frames:
            raise RequestError(f"--video {video} has {len(frames)} frames, fewer than --frames "
                               f"{args.frames}; lower --frames (4k+1)")
        frames = frames[:args.frames]
    call.update(num_frames=len(frames), height=args.height or frames.shape[1],
                width=args.width or frames.shape[2])
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


def read_control(args) -> dict:
    """VACE's ``--mask`` (frames in [0, 1]) / ``--reference-image`` / ``--conditioning-scale``
    as call arguments; the folder's preflight checks them against it and the request."""
    from ditax.io.images import read_image
    from ditax.io.video import read_video

    out, refs = {}, getattr(args, "reference_image", None)
    if refs:
        out["reference_images"] = [read_image(r, "--reference-image") for r in refs]
    if getattr(args, "mask", None) is not None:
        out["mask"] = read_video(args.mask) / 255.0
    if getattr(args, "conditioning_scale", None) is not None:
        out["conditioning_scale"] = args.conditioning_scale
    return out


def read_animate(args, call: dict, s) -> dict:
    """Wan Animate's flags as its call (``pose_video=`` ... frames in [0, 1]); without any,
    ``call`` unchanged. The call has the Animate pipeline's keys only: its length is the pose
    video's (``--frames`` refused), ``--guidance`` defaults to diffusers' 1 (no CFG; above 1
    the unconditional branch takes ``--negative-prompt`` and a blank face), ``--height`` /
    ``--width`` to the image's; step caching (``sample.cache*``) passes through; the folder's
    preflight checks the rest."""
    from ditax.io.video import read_video
    from ditax.pipelines.wan.animate import GUIDANCE_SCALE

    given = {k: getattr(args, k, None) for k in ANIMATE_FLAGS}
    given = {k: v for k, v in given.items() if v is not None}
    if not given:
        return call
    bad = [f for f, v in (("--frames", args.frames), ("--guidance-2", args.guidance_2),
                          ("sample.sigmas", s.sigmas)) if v is not None]
    if bad:
        raise RequestError(f"{bad[0]} is not taken by Wan Animate (--pose-video given; the "
                           f"video is the pose video's length); drop it")
    out = {k: call[k] for k in ("prompt", "negative_prompt", "num_inference_steps", "seed",
                                "image", "last_image", "video", "mask", "reference_images",
                                "conditioning_scale", "strength", "cache", "cache_threshold",
                                "cfg_cache", "cache_coefficients") if k in call}
    out["guidance_scale"] = args.guidance if args.guidance is not None else GUIDANCE_SCALE
    for key, v in given.items():
        out[ANIMATE_FLAGS[key]] = read_video(v) / 255.0 if key.endswith("_video") else v
    img = out.get("image")
    size = (img.height, img.width) if hasattr(img, "height") else (call["height"], call["width"])
    out["height"] = args.height if args.height is not None else size[0]
    out["width"] = args.width if args.width is not None else size[1]
    return out


__all__ = ["ANIMATE_FLAGS", "add_arguments", "read", "read_control", "read_images", "read_loras_2",
           "read_source_video"]
