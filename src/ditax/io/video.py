"""Writing generated videos: H.264 mp4 (the ffmpeg imageio-ffmpeg ships) and PNG frames.

Videos are float ``[F, H, W, 3]`` in [0, 1] (what the pipeline returns) or uint8. Both writers
write beside the target and rename at the end (:func:`ditax.io.outputs.staged`): a failed or
killed write never leaves a half-written mp4 or a partial set of frames under the requested
name, and a file that was there stays as it was. ffmpeg's exit status and error lines are
read (:mod:`ditax.io.ffmpeg`): an mp4 ffmpeg could not finish (the disk full, a file-size
limit) is :class:`~ditax.io.outputs.WriteFailed` naming it, never a file reported written.
Both take ``stage=``: the :class:`~ditax.io.outputs.Staging` of one request's outputs (the mp4,
its frames, its extra arrays), renamed together when all of them are written.
"""

from __future__ import annotations

import os
import pathlib
from fractions import Fraction

import numpy as np

from ditax.io.ffmpeg import quiet_fork as _ffmpeg_subprocess  # noqa: F401 - readers use it
from ditax.io.outputs import check_output_folder, staged


def to_uint8(video) -> np.ndarray:
    """``[F, H, W, 3]`` float in [0, 1] (clipped) or uint8 → uint8 ``[F, H, W, 3]``."""
    v = np.asarray(video)
    if v.ndim != 4 or v.shape[-1] != 3:
        raise ValueError(f"video must be [F, H, W, 3]; got shape {v.shape}")
    if v.dtype == np.uint8:
        return v
    from ditax.io.frames import uint8_frames   # round(clip(v, 0, 1) * 255), frame by frame

    return uint8_frames(v)


def check_mp4(height: int, width: int, quality: float) -> None:
    """The H.264 (yuv420p) rules of :func:`write_mp4`: an even height and width, ``quality``
    in [1, 10] (``ValueError`` naming the value)."""
    if height % 2 or width % 2:
        raise ValueError(f"H.264 (yuv420p) needs even height and width; got {height}x{width}")
    if not 1 <= quality <= 10:
        raise ValueError(f"quality={quality} must be in [1, 10]")


def write_mp4(path, video, fps: float = 16, quality: float = 8.0,
              audio=None, stage=None, encoded=None) -> pathlib.Path:
    """Encode ``video`` as H.264 (yuv420p, so height and width must be even) at ``fps``, with
    ``audio`` (an :class:`~ditax.io.audio.AudioTrack`, None: silent) as its AAC sound track.

    Wan models are trained at 16 fps. ``quality`` is imageio-ffmpeg's 1-10 scale (CRF
    ``(1 - quality / 10) * 51``, as imageio-ffmpeg maps it). ``stage``: module docstring.
    ``encoded``: a started :class:`~ditax.io.video_stream.Mp4Stream` that has been fed these
    frames as they were made (the same encoder settings, so the same bytes): its file is
    waited for and taken instead of encoding ``video`` again.
    """
    frames = to_uint8(video) if encoded is None else np.asarray(video)
    _, h, w, _ = frames.shape
    check_mp4(h, w, quality)
    path = pathlib.Path(path)
    with staged(stage) as s:
        tmp = s.file(path)
        if encoded is None:
            encode_mp4(tmp, frames, fps, quality)
        else:
            encoded.finish(tmp, len(frames))
        if audio is not None:
            _add_audio(tmp, audio)
    return path


def mp4_args(tmp, height: int, width: int, fps: float, quality: float = 8.0, *,
             pix_fmt: str = "yuv420p", crf: int | None = None) -> list[str]:
    """ffmpeg's arguments of :func:`encode_mp4` (raw rgb24 frames on its standard input)."""
    rate = str(Fraction(fps).limit_denominator())
    crf = int((1 - quality / 10.0) * 51) if crf is None else crf
    return ["-f", "rawvideo", "-vcodec", "rawvideo", "-s", f"{width}x{height}", "-pix_fmt",
            "rgb24", "-r", rate, "-i", "-", "-an", "-vcodec", "libx264", "-pix_fmt",
            pix_fmt, "-crf", str(crf), "-f", "mp4", str(tmp)]


def frame_bytes(frames):
    """uint8 ``[F, H, W, 3]`` frames as the contiguous buffers ffmpeg reads, one a frame."""
    return (np.ascontiguousarray(f) for f in frames)


def encode_mp4(tmp: pathlib.Path, frames: np.ndarray, fps: float, quality: float = 8.0, *,
               pix_fmt: str = "yuv420p", crf: int | None = None) -> None:
    """uint8 ``frames`` as an H.264 mp4 at ``tmp`` (the file written in place; ffmpeg's
    failure is :class:`~ditax.io.outputs.WriteFailed`). The frames are written as they are:
    never resized (imageio's ``macro_block_size=1``). ``pix_fmt``: the stored chroma layout
    (``yuv444p`` keeps full-resolution colour; ``yuv420p`` plays everywhere but needs an even
    height and width); ``crf``: x264's rate factor (0: lossless; None: from ``quality`` as
    :func:`write_mp4` says)."""
    from ditax.io import ffmpeg

    _, h, w, _ = frames.shape
    ffmpeg.write(mp4_args(tmp, h, w, fps, quality, pix_fmt=pix_fmt, crf=crf), tmp,
                 frame_bytes(frames))


def _add_audio(tmp: pathlib.Path, audio) -> None:
    """Mux ``audio`` into the just-written mp4 ``tmp`` (still under its temporary name)."""
    from ditax.io.audio import mux_audio

    silent = tmp.with_name(tmp.stem + ".silent.mp4")
    os.replace(tmp, silent)
    try:
        mux_audio(silent, audio, tmp)
    finally:
        silent.unlink(missing_ok=True)


def write_frames(folder, video, prefix: str = "frame", stage=None) -> list[pathlib.Path]:
    """One PNG per frame: ``folder/frame_00000.png`` ...; returns the paths. ``folder`` must
    be new or empty (:func:`~ditax.io.outputs.check_output_folder`); the frames appear there
    all at once, when the last one is written. ``stage``: module docstring."""
    import imageio.v2 as imageio

    frames = to_uint8(video)
    folder = check_output_folder(folder, "folder")
    with staged(stage) as s:
        tmp = s.folder(folder)
        for i, f in enumerate(frames):
            imageio.imwrite(str(tmp / f"{prefix}_{i:05d}.png"), f)
    return [folder / f"{prefix}_{i:05d}.png" for i in range(len(frames))]


def read_video(path) -> np.ndarray:
    """Decode a video file to uint8 ``[F, H, W, 3]`` (used to check what was written); a file
    ffmpeg cannot read, or one without frames, is a
    :class:`~ditax.io.files.VideoReadError` naming it (not ffmpeg's banner)."""
    import imageio.v2 as imageio

    from ditax.io.files import video_error

    try:
        with _ffmpeg_subprocess(), imageio.get_reader(str(path), format="FFMPEG") as r:
            frames = [np.asarray(f) for f in r]
    except (OSError, RuntimeError, ValueError, IndexError) as e:
        raise video_error(path, e) from None
    if not frames:
        raise video_error(path, problem="has no video frames")
    return np.stack(frames)
