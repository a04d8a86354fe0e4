"""One request's outputs, written together: the main output (an mp4 for a video ``[F, H, W, 3]``,
a PNG for an image ``[H, W, 3]``), its PNG frames, a family's extra arrays beside it.

``ditax generate`` and ``ditax serve`` write a result with :func:`write_result`: every file
under a temporary name, all renamed when all are whole (:func:`ditax.io.outputs.staged`). A
write that fails is :class:`~ditax.io.outputs.WriteFailed` naming the file and the cause, and
nothing of the request is left under its names (a file that was there stays as it was).
"""

from __future__ import annotations

import pathlib


def write_result(path, main, *, fps: float = 16, audio=None, extras: dict | None = None,
                 frames_dir=None, encoded=None) -> list[pathlib.Path]:
    """Write ``main`` at ``path`` (a PNG when it is an image ``[H, W, 3]``, else an mp4 at
    ``fps`` with the sound track ``audio``), its frames as PNGs in ``frames_dir`` (a video's;
    None: none) and ``extras`` (``{kind: array}``) beside it as ``.npy``
    (:func:`~ditax.io.outputs.write_extras`); returns the extras' paths. ``encoded``: the
    :class:`~ditax.io.video_stream.Mp4Stream` that encoded ``main`` as it was made (its file
    is taken: :func:`~ditax.io.video.write_mp4`)."""
    from ditax.io.images import write_png
    from ditax.io.outputs import staged, write_extras
    from ditax.io.video import write_frames, write_mp4

    with staged() as stage:
        written = write_extras(path, extras or {}, stage=stage)
        if main.ndim == 3:
            write_png(path, main, stage=stage)
        else:
            write_mp4(path, main, fps=fps, audio=audio, stage=stage, encoded=encoded)
            if frames_dir:
                write_frames(frames_dir, main, stage=stage)
    return written


__all__ = ["write_result"]
