"""Reading the clips of a folder for ``ditax preprocess`` (and ``ditax train-vae``): frames
decoded by ffmpeg (imageio-ffmpeg; a still image by PIL) and brought to a target size by a
resize policy (:data:`RESIZE`: ``crop`` scales to cover and keeps the center, ``stretch``
scales each side on its own), float32 ``[3, F, H, W]`` in [-1, 1]; a clip's sidecars read
like it (a mask nearest-neighbour, so it stays binary); sizes from headers only, and the
files far smaller than the target (:data:`TINY`) named before any encoding."""

from __future__ import annotations

import pathlib

import numpy as np

from ditax.train.clip_files import IMAGE_EXT, clip_sidecars

RESIZE = ("crop", "stretch")     # --resize: the first is the default
TINY = 4     # a file more than this many times smaller than the target on a side is refused


def read_sidecars(path, accepted, num_frames: int, height: int, width: int, *,
                  resize: str = "stretch") -> dict:
    """The clip's sidecars read for its encoders (videos ``[3, F, H, W]`` in [-1, 1] like the
    clip, by the ``resize`` policy; the mask nearest-neighbour, so a binary mask stays binary;
    images as PIL, fitted by the encoders); a sidecar the family's encoders do not take
    (``accepted``) is a :class:`~ditax.errors.RequestError` naming it."""
    from ditax.errors import RequestError
    from ditax.io.images import read_image

    found = clip_sidecars(path)
    extra = [k for k in found if k not in accepted]
    if extra:
        names = [p.name for k in extra for p in (found[k] if k == "references" else [found[k]])]
        raise RequestError(f"{names[0]}: control / mask / reference sidecars are for a VACE "
                           f"pipeline folder (--model WanVACEPipeline); remove them or "
                           f"preprocess with a VACE folder")
    out = {k: read_video(p, num_frames, height, width, resize=resize, nearest=k == "mask")
           for k, p in found.items() if k != "references"}
    if "references" in found:
        out["references"] = [read_image(p, "reference image") for p in found["references"]]
    return out


def read_video(path, num_frames: int, height: int, width: int, *, resize: str = "stretch",
               nearest: bool = False) -> np.ndarray:
    """First ``num_frames`` frames brought to ``height × width`` by the ``resize`` policy
    (:data:`RESIZE`; ``crop``: scaled to cover, center kept; ``stretch``: each side scaled on
    its own — the default here, which ``ditax train-vae`` reads with; ``ditax preprocess``
    passes its ``--resize``), bicubic, or nearest-neighbour with ``nearest`` (masks): float32
    ``[3, F, H, W]`` in [-1, 1]."""
    from ditax.io.video import _ffmpeg_subprocess

    with _ffmpeg_subprocess():
        return _decode(path, num_frames, height, width, resize, nearest)[0]


def read_videos(paths, num_frames: int, height: int, width: int, *, workers: int = 4,
                ahead: int = 16, resize: str = "stretch"):
    """:func:`read_video` of every path, in order, decoded ``workers`` at a time (each by its
    own ffmpeg process, so they overlap with the caller's work); at most ``ahead`` decoded
    clips wait in memory."""
    for video, _ in _read_clips(paths, num_frames, height, width, workers=workers,
                                ahead=ahead, resize=resize):
        yield video


def _read_clips(paths, num_frames, height, width, *, workers=4, ahead=16, resize="stretch"):
    """:func:`read_videos`, each clip with its source size ``(w, h)``."""
    return _read_jobs([(p, num_frames, height, width, resize) for p in paths],
                      workers=workers, ahead=ahead)


def _read_jobs(jobs, *, workers=4, ahead=16):
    """``(video [3, F, H, W], source size (w, h))`` of each ``(path, frames, height, width,
    resize)`` of ``jobs`` (each clip its own size: a bucketed run), in order, decoded
    ``workers`` at a time; at most ``ahead`` decoded clips wait in memory."""
    import collections
    from concurrent.futures import ThreadPoolExecutor

    from ditax.io.video import _ffmpeg_subprocess

    jobs = list(jobs)
    # the warning filter is process-wide: set once here, not per thread (catch_warnings is not
    # thread-safe)
    with _ffmpeg_subprocess(), ThreadPoolExecutor(max(1, workers)) as pool:
        pending = collections.deque()
        for job in jobs:
            pending.append(pool.submit(_decode, *job))
            if len(pending) >= max(1, ahead):
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def _scale_filter(height: int, width: int, resize: str, nearest: bool) -> str:
    """The ffmpeg ``-vf`` of a policy: ``crop`` scales to cover (aspect kept) and crops the
    center (``crop``'s default offsets are centered); ``stretch`` scales to the size."""
    flags = ":flags=neighbor" if nearest else ""     # else ffmpeg's default, bicubic
    if resize == "crop":
        return (f"scale={width}:{height}:force_original_aspect_ratio=increase{flags},"
                f"crop={width}:{height}")
    return f"scale={width}:{height}{flags}"


def _decode(path, num_frames: int, height: int, width: int, resize: str = "stretch",
            nearest: bool = False) -> tuple[np.ndarray, tuple[int, int]]:
    """One clip decoded, and its source size ``(w, h)``; a file ffmpeg cannot read, an empty
    file or a clip shorter than ``num_frames`` is a :class:`~ditax.io.files.VideoReadError`
    naming the clip."""
    import imageio_ffmpeg

    from ditax.io.files import video_error

    if resize not in RESIZE:
        raise ValueError(f"resize={resize!r} is not one of {', '.join(RESIZE)}")
    if pathlib.Path(path).suffix.lower() in IMAGE_EXT:
        return _decode_image(path, num_frames, height, width, resize, nearest)
    frames = []
    try:
        gen = imageio_ffmpeg.read_frames(str(path), output_params=[
            "-vf", _scale_filter(height, width, resize, nearest)])
        source = _source_size(next(gen))    # metadata (starts ffmpeg)
        for raw in gen:
            frames.append(np.frombuffer(raw, np.uint8).reshape(height, width, 3))
            if len(frames) == num_frames:
                break
        gen.close()
    except (OSError, RuntimeError, StopIteration, ValueError) as e:
        raise video_error(path, e) from None
    if len(frames) < num_frames:
        raise video_error(path, problem=f"has {len(frames)} frames, fewer than --frames="
                          f"{num_frames}", fix="lower --frames (4k+1) or remove the clip")
    v = np.stack(frames).astype(np.float32) / 127.5 - 1.0      # [F, H, W, 3]
    return v.transpose(3, 0, 1, 2), source


def _source_size(meta: dict) -> tuple[int, int]:
    """``(w, h)`` of the frames ffmpeg decodes (before the filter), as displayed: a clip
    stored rotated by 90 or 270 degrees is turned upright by ffmpeg."""
    w, h = meta.get("source_size") or meta["size"]
    return (h, w) if meta.get("rotate", 0) % 180 == 90 else (w, h)


def _decode_image(path, num_frames: int, height: int, width: int, resize: str = "stretch",
                  nearest: bool = False) -> tuple[np.ndarray, tuple[int, int]]:
    """A still image as a clip of one frame ``[3, 1, H, W]`` in [-1, 1] (``--frames 1``),
    and its size ``(w, h)``; ``crop``: ``PIL.ImageOps.fit`` (the centered region of the
    target's aspect ratio, scaled)."""
    import PIL.Image
    import PIL.ImageOps

    from ditax.io.files import video_error

    if num_frames != 1:
        raise video_error(path, problem=f"is a still image (1 frame), fewer than --frames="
                          f"{num_frames}", fix="use --frames 1 for images")
    how = PIL.Image.Resampling.NEAREST if nearest else PIL.Image.Resampling.BICUBIC
    try:
        with PIL.Image.open(path) as im:
            source = im.size
            im = im.convert("RGB")
            im = (PIL.ImageOps.fit(im, (width, height), method=how) if resize == "crop"
                  else im.resize((width, height), how))
            v = np.asarray(im, np.float32) / 127.5 - 1.0            # [H, W, 3]
    except (OSError, ValueError) as e:
        raise video_error(path, problem=f"cannot be read as an image ({e})",
                          fix="re-save it as PNG or remove it") from None
    return v.transpose(2, 0, 1)[:, None], source


def source_size(path) -> tuple[int, int]:
    """``(w, h)`` of an image (its header, PIL) or a video (ffmpeg's metadata; the frames are
    not decoded); an unreadable file is a :class:`~ditax.io.files.VideoReadError` naming it."""
    import imageio_ffmpeg
    import PIL.Image

    from ditax.io.files import video_error

    if pathlib.Path(path).suffix.lower() in IMAGE_EXT:
        try:
            with PIL.Image.open(path) as im:
                return im.size
        except (OSError, ValueError) as e:
            raise video_error(path, problem=f"cannot be read as an image ({e})",
                              fix="re-save it as PNG or remove it") from None
    try:
        gen = imageio_ffmpeg.read_frames(str(path))
        try:
            return _source_size(next(gen))
        finally:
            gen.close()
    except (OSError, RuntimeError, StopIteration, ValueError) as e:
        raise video_error(path, e) from None


def other_aspect(size, height: int, width: int) -> bool:
    """Whether a source ``(w, h)`` has another aspect ratio than ``width : height`` (then
    ``crop`` cuts some of it, ``stretch`` distorts it)."""
    w, h = size
    return w * height != h * width


def size_problems(paths, height: int, width: int, workers: int = 4) -> list[str]:
    """One line per file of ``paths`` more than :data:`TINY` times smaller than ``width x
    height`` on a side (its size and the target), read from headers only, ``workers`` at a
    time."""
    from concurrent.futures import ThreadPoolExecutor

    from ditax.io.files import VideoReadError
    from ditax.io.video import _ffmpeg_subprocess

    def one(p):
        try:
            w, h = source_size(p)
        except VideoReadError as e:
            return str(e)
        if w * TINY < width or h * TINY < height:
            return (f"{pathlib.Path(p).name} is {w}x{h} (WxH), more than {TINY}x smaller than "
                    f"the target {width}x{height} on a side (an upscale that trains on blur); "
                    f"remove it, or lower --width / --height")
        return None

    with _ffmpeg_subprocess(), ThreadPoolExecutor(max(1, workers)) as pool:
        return [r for r in pool.map(one, list(paths)) if r]
