"""Chunk events of a causal model's jobs (issue 59): a served pipeline whose call samples chunk
by chunk (``pipe.streams_chunks``: a causal student, :func:`ditax.pipelines.wan.causal.video`)
reports each decoded chunk; :class:`ChunkLog` keeps them per job for
``GET /v1/videos/{id}/events`` (:func:`ditax.serve.app.event_stream`), which sends one event
per finished chunk — ``chunk: {index, frames, first, count, url}`` (``frames``: made so far;
this chunk's ``count`` frames from frame ``first``; ``url``: its frames) beside the job's
JSON — before the job's completion event, and sets the job's progress to the frames made.

A chunk's frames are one JPEG of its ``count`` frames stacked top to bottom (``count x H`` by
``W``), ``GET /v1/videos/{id}/chunks/{index}`` (:func:`chunk_frames`): the web page draws
them while the rest of the video is made. They are kept for the last :data:`KEEP_FRAMES`
jobs only (the mp4 is the finished job's record); the events' ``url`` is absent where none
were kept.

The log is the server's memory, not the store's: a stream that another server on a shared
store answers shows the job's progress, without chunk events. It keeps the last
:data:`KEEP` jobs' chunks (a stream opened after its job finished still gets them, in order).
"""

from __future__ import annotations

import collections
import io
import re
import threading

#: jobs whose chunks the log keeps (the oldest dropped first)
KEEP = 64
#: jobs whose chunks' frames (JPEG strips) the log keeps
KEEP_FRAMES = 4
JPEG_QUALITY = 90


class Stopping(Exception):
    """The server is stopping and the drain is over: the running batch goes back to the
    queue (raised from the step callback, between two steps)."""


class Cancelled(Exception):
    """Every job of the running batch was cancelled."""


def frame_strip(frames) -> bytes:
    """Float ``[f, H, W, 3]`` in [0, 1] (or uint8) → one JPEG of the frames stacked top to
    bottom (``[f H, W, 3]``)."""
    import PIL.Image

    from ditax.io.video import to_uint8

    v = to_uint8(frames)
    buf = io.BytesIO()
    PIL.Image.fromarray(v.reshape(-1, *v.shape[2:])).save(buf, "JPEG", quality=JPEG_QUALITY)
    return buf.getvalue()


class ChunkLog:
    """Per job id, the chunks finished so far, in order: ``{"index", "frames", "first",
    "count", "progress"}``; their frames (:func:`frame_strip`) for the last
    :data:`KEEP_FRAMES` jobs."""

    def __init__(self):
        self._jobs: collections.OrderedDict[str, list[dict]] = collections.OrderedDict()
        self._strips: collections.OrderedDict[str, list[bytes]] = collections.OrderedDict()
        self._lock = threading.Lock()

    def add(self, job_id: str, index: int, frames: int, progress: int,
            strip: bytes | None = None) -> None:
        """Log chunk ``index`` of ``job_id`` (``frames``: made so far), with its frames'
        ``strip`` (None: not kept)."""
        with self._lock:
            chunks = self._jobs.setdefault(job_id, [])
            first = chunks[-1]["frames"] if chunks else 0
            chunks.append({"index": int(index), "frames": int(frames), "first": first,
                           "count": int(frames) - first, "progress": int(progress)})
            self._jobs.move_to_end(job_id)
            while len(self._jobs) > KEEP:
                self._jobs.popitem(last=False)
            if strip is not None:
                self._strips.setdefault(job_id, []).append(strip)
                self._strips.move_to_end(job_id)
                while len(self._strips) > KEEP_FRAMES:
                    self._strips.popitem(last=False)

    def since(self, job_id: str, seen: int) -> list[dict]:
        """The chunks of ``job_id`` after the first ``seen`` (``url`` in those whose frames
        are kept)."""
        with self._lock:
            kept = len(self._strips.get(job_id, ()))
            return [{**c, **({"url": f"/v1/videos/{job_id}/chunks/{c['index']}"}
                             if c["index"] < kept else {})}
                    for c in self._jobs.get(job_id, ())[seen:]]

    def strip(self, job_id: str, index: int) -> bytes | None:
        """Chunk ``index``'s frames of ``job_id`` (None: not made, or no longer kept)."""
        with self._lock:
            strips = self._strips.get(job_id, ())
            return strips[index] if index < len(strips) else None

    def drop(self, job_id: str) -> None:
        """Forget a job's chunks (it goes back to the queue: its next run starts over)."""
        with self._lock:
            self._jobs.pop(job_id, None)
            self._strips.pop(job_id, None)

    def hook(self, worker, job_id: str, call: dict) -> dict:
        """The keyword arguments that make ``worker.pipe``'s call of ``call`` report its chunks
        for ``job_id`` (``{}`` for a pipeline that does not stream chunks): each chunk logged
        with its frames, the job's progress set to its frames so far (< 100 until it
        completes), then a cancelled job or a stopping server's drain ends the run between
        two chunks."""
        if not getattr(worker.pipe, "streams_chunks", False):
            return {}
        total = max(int(call.get("num_frames") or 1), 1)
        self.drop(job_id)

        def on_chunk(index: int, frames: int, pixels=None) -> None:
            progress = min(99, frames * 100 // total)
            self.add(job_id, index, frames, progress,
                     None if pixels is None else frame_strip(pixels))
            worker.store.set_progress(job_id, progress)
            if worker.overdue():
                raise Stopping()
            if job_id in worker.cancelled:
                raise Cancelled()

        return {"on_chunk": on_chunk}


def chunk_frames(log: ChunkLog | None, job: dict, index: str):
    """``GET /v1/videos/{id}/chunks/{index}`` of ``job`` (a store row): the chunk's JPEG
    strip (bytes), else ``(status, message, param)`` — 400 for an index that is no
    integer, 404 for a chunk not made (yet) or no longer kept."""
    job_id = job["id"]
    if not re.fullmatch(r"[0-9]{1,6}", index):
        return 400, f"index={index!r} must be a chunk number 0, 1, ... (the events' " \
                    f"chunk.index)", "index"
    made = [] if log is None else log.since(job_id, 0)
    got = None if log is None else log.strip(job_id, int(index))
    if got is not None:
        return got
    if int(index) >= len(made):
        return 404, f"video {job_id} has {len(made)} chunk(s) made on this server, not " \
                    f"chunk {index} (is it a causal model's job? it is {job['status']})", \
            "index"
    return 404, f"the frames of video {job_id}'s chunk {index} are no longer kept (the " \
                f"last {KEEP_FRAMES} jobs' are); GET /v1/videos/{job_id}/content", "index"


__all__ = ["KEEP", "KEEP_FRAMES", "Cancelled", "ChunkLog", "Stopping", "chunk_frames",
           "frame_strip"]
