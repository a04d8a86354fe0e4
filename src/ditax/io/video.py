"""Writing generated videos: H.264 mp4 (imageio + imageio-ffmpeg) and PNG frames.

Videos are float ``[F, H, W, 3]`` in [0, 1] (what the pipeline returns) or uint8. Both writers
write beside the target and rename at the end (:mod:`ditax.io.outputs`): a failed or killed
write never leaves a half-written mp4 or a partial set of frames under the requested name.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import warnings

import numpy as np

from ditax.io.outputs import atomic_file, atomic_folder, check_output_folder


@contextlib.contextmanager
def _ffmpeg_subprocess():
    """imageio-ffmpeg starts ffmpeg with subprocess (fork + immediate exec), which Python
    flags as unsafe in a multithreaded (JAX) process. The child only execs ffmpeg, so the
    warning does not apply; it is silenced here and only here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called",
                                category=RuntimeWarning)
        yield


def to_uint8(video) -> np.ndarray:
    """``[F, H, W, 3]`` float in [0, 1] (clipped) or uint8 → uint8 ``[F, H, W, 3]``."""
    v = np.asarray(video)
    if v.ndim != 4 or v.shape[-1] != 3:
        raise ValueError(f"video must be [F, H, W, 3]; got shape {v.shape}")
    if v.dtype == np.uint8:
        return v
    return np.round(np.clip(v.astype(np.float32), 0.0, 1.0) * 255.0).astype(np.uint8)


def write_mp4(path, video, fps: float = 16, quality: float = 8.0,
              audio=None) -> pathlib.Path:
    """Encode ``video`` as H.264 (yuv420p, so height and width must be even) at ``fps``, with
    ``audio`` (an :class:`~ditax.io.audio.AudioTrack`, None: silent) as its AAC sound track.

    Wan models are trained at 16 fps. ``quality`` is imageio-ffmpeg's 0-10 scale.
    """
    import imageio.v2 as imageio

    frames = to_uint8(video)
    _, h, w, _ = frames.shape
    if h % 2 or w % 2:
        raise ValueError(f"H.264 (yuv420p) needs even height and width; got {h}x{w}")
    path = pathlib.Path(path)
    # macro_block_size=1: never let the writer resize frames behind our back
    with atomic_file(path) as tmp, _ffmpeg_subprocess():
        with imageio.get_writer(str(tmp), format="FFMPEG", mode="I", fps=fps, codec="libx264",
                                quality=quality, pixelformat="yuv420p",
                                macro_block_size=1) as writer:
            for f in frames:
                writer.append_data(f)
        if audio is not None:
            _add_audio(tmp, audio)
    return path


def _add_audio(tmp: pathlib.Path, audio) -> None:
    """Mux ``audio`` into the just-written mp4 ``tmp`` (still under its temporary name)."""
    from ditax.io.audio import mux_audio

    silent = tmp.with_name(tmp.stem + ".silent.mp4")
    os.replace(tmp, silent)
    try:
        mux_audio(silent, audio, tmp)
    finally:
        silent.unlink(missing_ok=True)


def write_frames(folder, video, prefix: str = "frame") -> list[pathlib.Path]:
    """One PNG per frame: ``folder/frame_00000.png`` ...; returns the paths. ``folder`` must
    be new or empty (:func:`~ditax.io.outputs.check_output_folder`); the frames appear there
    all at once, when the last one is written."""
    import imageio.v2 as imageio

    frames = to_uint8(video)
    folder = check_output_folder(folder, "folder")
    with atomic_folder(folder) as tmp:
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
