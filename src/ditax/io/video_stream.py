"""An mp4 encoded while its frames are still being made: ``ditax generate`` hands each chunk of
the Wan VAE's decode to ffmpeg as the chunk finishes, and the encode runs beside the decode of
the next chunks instead of after the whole video.

:class:`Mp4Stream` is what a pipeline call's ``frames_to=`` takes
(:meth:`ditax.pipelines.base.Pipeline.hand_frames`): ``put(frames)`` for each chunk in order
(float ``[f, H, W, 3]`` in [0, 1], or uint8), or ``whole(reason)`` where the decode ran whole
instead (then nothing was put: the caller encodes the returned video as before and says why).
The first ``put`` starts ffmpeg on a thread with :func:`~ditax.io.video.write_mp4`'s arguments
(:func:`~ditax.io.video.mp4_args`), writing a temporary file beside the output; each chunk is
made uint8 there (:func:`~ditax.io.video.to_uint8`) and written to ffmpeg's input, so the same
frames make the same file, byte for byte, as :func:`~ditax.io.video.write_mp4` of the whole
video. :func:`~ditax.io.video.write_mp4` with ``encoded=`` waits for it (:meth:`finish`) and
takes the file into the request's staged outputs (renamed with the others at the end).

Failures: the thread's error (ffmpeg's :class:`~ditax.io.outputs.WriteFailed`, or any other)
is raised by the next :meth:`put` (the decode stops there) or by :meth:`finish`; leaving the
``with`` block on an exception (the decode's, the write's) stops ffmpeg and removes the file
(:meth:`close`). A cut file is never taken for whole: :meth:`finish` checks the frame count.
"""

from __future__ import annotations

import os
import pathlib
import queue
import threading
import time

import numpy as np

from ditax.io.outputs import WriteFailed
from ditax.io.video import check_mp4, frame_bytes, mp4_args, to_uint8

_END, _ABORT = object(), object()


class StreamAborted(Exception):
    """The producer of an :class:`Mp4Stream` stopped before its last frames (ffmpeg killed)."""


class Mp4Stream:
    """An H.264 mp4 for ``path`` at ``fps`` and ``quality`` (:func:`~ditax.io.video.write_mp4`'s),
    encoded from the frames put as they come (module docstring). ``frames``: the frames put;
    ``reason``: why the decode ran whole (:meth:`whole`; None: it did not say);
    ``started`` / ``ended``: ``time.perf_counter()`` when ffmpeg started / exited (None: not
    yet)."""

    def __init__(self, path, fps: float = 16, quality: float = 8.0):
        self.path = pathlib.Path(path)
        self.fps, self.quality = fps, quality
        self.frames = 0
        self.reason: str | None = None
        self.started: float | None = None
        self.ended: float | None = None
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._size: tuple | None = None
        self._tmp = self.path.with_name(f".{self.path.stem}.stream-{os.getpid()}.mp4")

    def __enter__(self) -> "Mp4Stream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def used(self) -> bool:
        """Whether frames were put (ffmpeg started)."""
        return self._thread is not None

    # --- the producer's side (a pipeline's frames_to=)
    def put(self, frames) -> None:
        """Encode ``frames`` (``[f, H, W, 3]``, after every frame put before) on the thread;
        the thread's error so far is raised here."""
        self._raise()
        size = tuple(np.shape(frames)[1:])
        if self._thread is None:
            check_mp4(size[0], size[1], self.quality)
            try:
                self._tmp.parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise WriteFailed(self.path, e.errno, f"while making {e.filename}") from e
            self._size, self.started = size, time.perf_counter()
            self._thread = threading.Thread(target=self._run, args=size[:2], daemon=True,
                                            name="ditax-mp4")
            self._thread.start()
        elif size != self._size:
            raise ValueError(f"Mp4Stream: frames of {size} after frames of {self._size}")
        self.frames += len(frames)
        self._queue.put(frames)

    def whole(self, reason: str) -> None:
        """The decode ran whole, for ``reason`` (nothing is put; the caller writes as before)."""
        self.reason = reason

    # --- the writer's side
    def finish(self, target, frames: int) -> None:
        """Wait for ffmpeg to end the file and move it to ``target`` (a staged write's
        temporary path): the thread's error is raised here, and a stream fed other than
        ``frames`` frames is an error (the video made is not the one encoded)."""
        if self._thread is None:
            raise RuntimeError(f"Mp4Stream {self.path}: no frames were put")
        self._queue.put(_END)
        self._thread.join()
        self._raise()
        if self.frames != frames:
            raise RuntimeError(f"Mp4Stream {self.path}: {self.frames} frames were encoded, the "
                               f"video has {frames}")
        os.replace(self._tmp, target)

    def close(self) -> None:
        """Stop ffmpeg if it still runs (the producer failed) and remove its file; again: no-op."""
        if self._thread is not None and self._thread.is_alive():
            self._queue.put(_ABORT)
            self._thread.join()
        self._tmp.unlink(missing_ok=True)

    def overlapped(self, until: float) -> float:
        """Seconds ffmpeg ran before ``until`` (a ``perf_counter()``: the decode's end)."""
        if self.started is None:
            return 0.0
        end = until if self.ended is None else min(until, self.ended)
        return max(0.0, end - self.started)

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def _run(self, height: int, width: int) -> None:
        from ditax.io import ffmpeg

        try:
            ffmpeg.write(mp4_args(self._tmp, height, width, self.fps, self.quality),
                         self._tmp, self._feed())
        except WriteFailed as e:    # named as the output (the file there, if any, is kept)
            self._error = WriteFailed(self.path, e.errno, e.detail, self.path.exists())
        except BaseException as e:  # noqa: BLE001 — raised in the producer's thread
            self._error = e
        finally:
            self.ended = time.perf_counter()

    def _feed(self):
        while True:
            item = self._queue.get()
            if item is _END:
                return
            if item is _ABORT:
                raise StreamAborted(f"{self.path}: the frames' producer stopped")
            yield from frame_bytes(to_uint8(item))


__all__ = ["Mp4Stream", "StreamAborted"]
