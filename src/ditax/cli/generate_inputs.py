"""The inputs of ``ditax generate`` that are files: ``--image`` / ``--last-image``, the
source ``--video`` of video-to-video, VACE's ``--mask`` / ``--reference-image``, ``--lora``
files; each read and checked before any weights (an unreadable or unfit file is a
:class:`~ditax.errors.RequestError`: exit 2)."""

from __future__ import annotations

from ditax.cli import request_errors
from ditax.errors import RequestError


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
        with request_errors():
            check(call["prompt"], call["height"], call["width"], call["num_frames"],
                  call["num_inference_steps"], call["guidance_scale"])
    except RequestError as e:
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


def read_loras(specs: list[str], strict: bool = True, family: str | None = None) -> list:
    """``--lora FILE[:STRENGTH]`` values → ``[(Lora, strength)]``, each file read and its
    format checked here (a bad file is a :class:`~ditax.errors.WeightError`: exit 2; with
    ``strict=False`` unknown keys are skipped with a warning). Files are named by ``family``'s
    LoRA names (its spec's ``lora_names``; None: the default family's); a family without
    the capability ``lora`` is refused in one line."""
    from ditax.lora import parse_lora_arg, resolve_loras
    from ditax.models import registry

    name = family or registry.DEFAULT_FAMILY
    if specs:       # a family that reads no LoRA files: one line, before any file is read
        registry.require(name, "lora", f"--lora {specs[0]}", "drop --lora")
    return resolve_loras([parse_lora_arg(s) for s in specs], strict,
                         names=registry.spec(name).lora_names_object())


__all__ = ["read_control", "read_images", "read_loras", "read_source_video"]
