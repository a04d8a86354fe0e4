"""``ditax generate``'s Wan 2.2 Animate flags (``WanAnimatePipeline`` folders): ``--pose-video``,
``--face-video``, ``--mode``, ``--background-video`` / ``--mask-video`` (replace),
``--segment-frame-length``, ``--prev-segment-frames``, read into the Animate pipeline's call
(:class:`~ditax.pipelines.wan.animate.WanAnimate`); the folder's preflight
(:func:`~ditax.pipelines.wan.family.check_animate_fits`) checks them against it."""

from __future__ import annotations

import argparse

from ditax.errors import RequestError

# Wan Animate's flags (argparse name -> the WanAnimate call's argument)
ANIMATE_FLAGS = {"pose_video": "pose_video", "face_video": "face_video", "mode": "mode",
                 "background_video": "background_video", "mask_video": "mask_video",
                 "segment_frame_length": "segment_frame_length",
                 "prev_segment_frames": "prev_segment_conditioning_frames"}


def add_animate_arguments(p: argparse.ArgumentParser) -> None:
    """The Animate flags on ``ditax generate``'s parser (all default None: not given)."""
    p.add_argument("--pose-video", default=None, metavar="POSE.mp4",
                   help="Wan Animate folders: the rendered pose frames at the output size "
                        "(with --image REF and --face-video; the video's length)")
    p.add_argument("--face-video", default=None, metavar="FACE.mp4",
                   help="Wan Animate folders: one face crop per pose frame")
    p.add_argument("--mode", default=None, choices=("animate", "replace"),
                   help="Wan Animate folders: animate the image, or replace the person in "
                        "--background-video where --mask-video is white (animate)")
    p.add_argument("--background-video", default=None, metavar="BG.mp4",
                   help="Wan Animate --mode replace: the source with the person removed")
    p.add_argument("--mask-video", default=None, metavar="MASK.mp4",
                   help="Wan Animate --mode replace: white = the person's region (generated)")
    p.add_argument("--segment-frame-length", type=int, default=None, metavar="N",
                   help="Wan Animate folders: frames per segment, 4k+1 (77)")
    p.add_argument("--prev-segment-frames", type=int, default=None, metavar="N",
                   help="Wan Animate folders: frames a segment takes from the one before (1)")


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


__all__ = ["ANIMATE_FLAGS", "add_animate_arguments", "read_animate"]
