"""Chunk events of a causal model's jobs (issue 59): a served pipeline whose call samples chunk
by chunk (``pipe.streams_chunks``: a causal student, :func:`ditax.pipelines.wan.causal.video`)
reports each decoded chunk; :class:`ChunkLog` keeps them per job for
``GET /v1/videos/{id}/events`` (:func:`ditax.serve.app.event_stream`), which sends one event
per finished chunk — ``chunk: {index, frames}`` (frames made so far) beside the job's JSON —
before the job's completion event, and sets the job's progress to the frames made.

The log is the server's memory, not the store's: a stream that another server on a shared
store answers shows the job's progress, without chunk events. It keeps the last
:data:`KEEP` jobs' chunks (a stream opened after its job finished still gets them, in order).
"""

from __future__ import annotations

import collections
import threading

#: jobs whose chunks the log keeps (the oldest dropped first)
KEEP = 64


class Stopping(Exception):
    """The server is stopping and the drain is over: the running batch goes back to the
    queue (raised from the step callback, between two steps)."""


class Cancelled(Exception):
    """Every job of the running batch was cancelled."""


class ChunkLog:
    """Per job id, the chunks finished so far, in order: ``{"index", "frames", "progress"}``."""

    def __init__(self):
        self._jobs: collections.OrderedDict[str, list[dict]] = collections.OrderedDict()
        self._lock = threading.Lock()

    def add(self, job_id: str, index: int, frames: int, progress: int) -> None:
        with self._lock:
            self._jobs.setdefault(job_id, []).append(
                {"index": int(index), "frames": int(frames), "progress": int(progress)})
            self._jobs.move_to_end(job_id)
            while len(self._jobs) > KEEP:
                self._jobs.popitem(last=False)

    def since(self, job_id: str, seen: int) -> list[dict]:
        """The chunks of ``job_id`` after the first ``seen``."""
        with self._lock:
            return list(self._jobs.get(job_id, ())[seen:])

    def drop(self, job_id: str) -> None:
        """Forget a job's chunks (it goes back to the queue: its next run starts over)."""
        with self._lock:
            self._jobs.pop(job_id, None)

    def hook(self, worker, job_id: str, call: dict) -> dict:
        """The keyword arguments that make ``worker.pipe``'s call of ``call`` report its chunks
        for ``job_id`` (``{}`` for a pipeline that does not stream chunks): each chunk logged,
        the job's progress set to its frames so far (< 100 until it completes), then a
        cancelled job or a stopping server's drain ends the run between two chunks."""
        if not getattr(worker.pipe, "streams_chunks", False):
            return {}
        total = max(int(call.get("num_frames") or 1), 1)
        self.drop(job_id)

        def on_chunk(index: int, frames: int) -> None:
            progress = min(99, frames * 100 // total)
            self.add(job_id, index, frames, progress)
            worker.store.set_progress(job_id, progress)
            if worker.overdue():
                raise Stopping()
            if job_id in worker.cancelled:
                raise Cancelled()

        return {"on_chunk": on_chunk}


__all__ = ["KEEP", "Cancelled", "ChunkLog", "Stopping"]
