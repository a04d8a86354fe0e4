"""The model thread of ``ditax serve``: one loaded pipeline, jobs from the store, mp4s out.

The pipeline is loaded once; its compiled programs stay in it, one per request signature
(:class:`~ditax.pipelines.programs.Programs`, and jax's persistent cache on disk), so a second
job of a shape compiles nothing — :class:`Metrics` counts the programs handed to XLA (compiled,
or read from the persistent cache: those are counted apart too) through jax's public monitoring
events, per job and in total (``/metrics``, :mod:`ditax.serve.metrics`). With ``--batching
continuous`` (the default) jobs join and leave the running batch between steps
(:mod:`ditax.serve.rows`); with ``static`` the thread claims up to ``max_batch`` queued jobs of
one batch key (:meth:`~ditax.serve.jobs.JobStore.claim`) and runs them as one lock-step batch
through the generic loop (:mod:`ditax.serve.batch`, :mod:`ditax.pipelines.batch`; padded to a
power of two, so batch sizes share programs), as it does step-cached requests in either mode,
whatever the family: text- and image-to-video, an image model's (FLUX.1: a PNG,
:func:`ditax.io.images.write_png`); every request of a pipeline that hands out no loop parts
runs alone (its own call). Each output is written to a temporary file and renamed
(:func:`ditax.io.results.write_result`; a continuous batch's by writer threads), then the job
is marked completed: a file a client may download is always whole (a failed write: failed).

Cancelling a running job (``DELETE``) drops its video; a batch whose every job is cancelled
stops at the next step. Stopping is cooperative, as jax cannot be interrupted inside a step:
:meth:`Worker.begin_stop` (SIGTERM) claims nothing more and gives the running batch ``drain``
seconds to finish; past them (or at once after :meth:`Worker.hurry`) the step callback raises
:class:`Stopping` after the step it ends, and the batch goes back to the queue (queued,
progress 0) for the next server on the store. The process joins the thread before it exits: a
thread still inside XLA when the interpreter ends aborts it (``FATAL: exception not
rethrown``).
"""

from __future__ import annotations

import contextlib
import pathlib
import threading
import time
import traceback

import jax

from ditax.errors import DitaxError
from ditax.serve.batch import by_strengths
from ditax.serve.chunks import Cancelled, ChunkLog, Stopping
from ditax.serve.jobs import JobStore
from ditax.serve.metrics import Metrics
from ditax.serve.requests import BATCHING, call_of
from ditax.serve.rows import warnings_said

def about(said: list[str], job: dict, batch: int) -> list[str]:
    """The warnings of a run that are this job's: all of a job run alone; in a batch, those
    that name its prompt (the tokenizer names the prompt it cut)."""
    if batch == 1:
        return list(said)
    head = str(job["request"].get("prompt", ""))[:40]
    return [m for m in said if head and head in m]


#: seconds the worker waits before it asks a store that did not answer again
STORE_RETRY = 2.0
#: threads that write finished outputs (mp4 encoding runs ffmpeg, off the model thread)
WRITERS = 2


class Worker(threading.Thread):
    """Runs the store's jobs on ``pipe`` until :meth:`stop`; videos go to ``output_dir`` as
    ``<job id>.mp4``. ``drain``: the seconds a running batch may go on once stopping begins."""

    #: a lock-step batch shares one ("next",) / ("halt",) turn after each step (serve.group)
    SHARES_STEPS = True

    def __init__(self, pipe, store: JobStore, output_dir, max_batch: int = 4,
                 metrics: Metrics | None = None, say=print, context=None, drain: float = 0.0,
                 batching: str = "continuous", max_wait: float = 10.0, group=None):
        super().__init__(name="ditax-serve-worker", daemon=True)
        if batching not in BATCHING:
            raise ValueError(f"batching={batching!r}; expected one of {', '.join(BATCHING)}")
        self.mode, self.max_wait = batching, max_wait
        # the other processes of a multi-process server (ditax.serve.group), or None
        self.group = group
        self.rows = None                 # the continuous batch (serve.rows.Rows), in the loop
        self.writer = None               # threads writing finished outputs (publish_later)
        self.pending: set[str] = set()   # jobs whose outputs are being written
        # entered in this thread around the loop (jax's config scopes, such as the compile
        # cache's, are per thread): run_context(...) of the served model
        self.context = context or contextlib.nullcontext
        self.pipe, self.store, self.max_batch = pipe, store, max_batch
        self.output_dir = pathlib.Path(output_dir)
        self.metrics = metrics or Metrics()
        self.say = say
        self.wake = threading.Event()
        self.drain = drain
        # plain attributes, no locks: a signal handler sets them (begin_stop, hurry)
        self.deadline = None             # monotonic time the drain ends; None: not stopping
        self.hurried = False             # a second signal ended the drain
        self.cancelled: set[str] = set()
        self.chunks = ChunkLog()         # a causal model's finished chunks (serve.chunks)
        self.batching = False            # set when the loop starts (serve.batch.batchable)
        self.running: list[str] = []
        self.started = False             # /health: a started worker that is not alive died
        jax.monitoring.register_event_duration_secs_listener(self.metrics.on_event)
        jax.monitoring.register_event_listener(self.metrics.on_plain_event)

    def warm(self, requests: list[dict]) -> float:
        """Compile, before the first job, every program the worker runs for ``requests`` (stored
        requests, as :func:`~ditax.serve.requests.check_body` makes them: one per configured
        size) at each batch size it may run (:func:`~ditax.serve.batch.bucket`: 1, 2, 4, ...
        up to ``max_batch``): text encoders, the denoise step, the decode; reading the
        persistent compile cache where it holds them. Continuous and static batching compile
        their step programs without running a step, in parallel threads
        (:meth:`~ditax.pipelines.continuous.ContinuousBatch.warm`,
        :func:`~ditax.serve.batch.warm_dry`); ``off`` runs one request. Runs in the calling
        thread, inside the worker's context; returns the seconds it took."""
        from ditax.serve.batch import batchable, warm_programs

        t0 = time.perf_counter()
        with self.context():
            if self.mode == "continuous" and batchable(self.pipe):
                from ditax.pipelines.continuous import ContinuousBatch

                rows = ContinuousBatch(self.pipe, self.max_batch)
                for r in requests:
                    rows.warm(call_of(r), strengths=r.get("lora_strengths"))
            else:
                warm_programs(self.pipe, [call_of(r) for r in requests],
                              self.max_batch if self.mode == "static" else 1, say=self.say)
        return time.perf_counter() - t0

    def cancel(self, job_id: str) -> None:
        """Drop a running job's video (its batch stops once all its jobs are cancelled)."""
        self.cancelled.add(job_id)

    @property
    def stopping(self) -> bool:
        return self.deadline is not None

    def begin_stop(self) -> None:
        """Claim no more jobs; the running batch may finish within ``drain`` seconds from the
        first call, else it goes back to the queue after the step that ends past them. Safe in
        a signal handler (it takes no lock: an idle worker sees it within half a second, or at
        once after ``wake.set()``)."""
        if self.deadline is None:
            self.deadline = time.monotonic() + self.drain

    def hurry(self) -> None:
        """End the drain now: the running batch goes back to the queue after its step (safe in
        a signal handler)."""
        now = time.monotonic()
        if self.deadline is None or now < self.deadline:
            self.hurried = self.drain > 0
            self.deadline = now

    def overdue(self) -> bool:
        """Stopping and the drain is over: the running batch must go back to the queue."""
        deadline = self.deadline
        return deadline is not None and time.monotonic() >= deadline

    def stop(self, timeout: float | None = None) -> None:
        """:meth:`begin_stop`, then wait up to ``timeout`` seconds for the thread to end."""
        self.begin_stop()
        self.wake.set()
        self.join(timeout)

    def handed_back(self, ids: list[str]) -> str:
        """The line that says ``ids`` went back to the queue, and why then."""
        jobs = f"job {ids[0]}" if len(ids) == 1 else f"jobs {', '.join(ids)}"
        why = (f"(a second signal ended the {self.drain:g} s drain)" if self.hurried
               else f"after the {self.drain:g} s drain")
        return f"stopping: {jobs} handed back to the queue {why}"

    def run(self) -> None:
        self.started = True
        with self.context():
            self.loop()

    def loop(self) -> None:
        from ditax.serve.batch import batchable
        from ditax.serve.rows import Rows

        self.batching = batchable(self.pipe) and self.mode != "off"
        if self.batching and self.mode == "continuous":
            self.rows = Rows(self, self.max_wait)
        while True:
            if self.rows is not None and self.rows.live:
                self.running = list(self.rows.live)
                self.rows.tick()
                self.running = list(self.rows.live)
                continue
            if self.stopping:
                break
            try:
                jobs = self.store.claim(self.max_batch if self.batching else 1)
            except Exception as e:  # noqa: BLE001 — a store that does not answer: wait, retry
                self.say(f"the job store did not answer ({type(e).__name__}: {e}); retrying "
                         f"in {STORE_RETRY:g} s")
                self.wake.wait(STORE_RETRY)
                continue
            if not jobs:
                self.wake.wait(0.5)
                self.wake.clear()
                continue
            if self.rows is not None and all(self.rows.takes(j) for j in jobs):
                self.running = [j["id"] for j in jobs]
                self.rows.start(jobs)
                self.running = list(self.rows.live)
                continue
            self.count_retried(jobs)
            for group in by_strengths(jobs):    # a lock-step batch shares its LoRA strengths
                self.running = [j["id"] for j in group]
                try:
                    if self.overdue():
                        raise Stopping()
                    self.run_jobs(group)
                except Stopping:
                    back = [j["id"] for j in group if self.store.requeue(j["id"])]
                    if back:
                        self.say(self.handed_back(back))
                except Exception as e:  # noqa: BLE001 — a job's failure never ends the worker
                    self.fail_unfinished(group, f"{type(e).__name__}: {e}")
                    traceback.print_exc()
                finally:
                    self.running = []
        self.share([("stop",)])
        if self.writer is not None:      # every finished output written before the end
            self.writer.shutdown(wait=True)

    def share(self, ops: list) -> list:
        """``ops`` (what this turn runs) handed to the other processes of a multi-process
        server, which run the same (:mod:`ditax.serve.group`); ``ops`` as they are without."""
        return ops if self.group is None else self.group.share(ops)

    def count_retried(self, jobs: list[dict]) -> None:
        """Jobs claimed again (after a stop, a failure of their server or an expired lease)."""
        again = sum(1 for j in jobs if (j.get("attempts") or 1) > 1)
        if again:
            self.metrics.add(retried=again)

    def fail_unfinished(self, jobs: list[dict], message: str) -> None:
        """Fail each of ``jobs`` still in progress with ``message`` (the worker goes on)."""
        self.say(f"jobs {', '.join(j['id'] for j in jobs)} failed: {message}")
        for j in jobs:
            row = self.store.get(j["id"])
            if row is not None and row["status"] == "in_progress":
                if self.store.finish(j["id"], "failed", error=message):
                    self.metrics.add(failed=1)

    def run_jobs(self, jobs: list[dict]) -> None:
        from ditax.serve.batch import bucket, generate_batch

        ids = [j["id"] for j in jobs]
        try:
            calls = [call_of(j["request"]) for j in jobs]
        except DitaxError as e:
            for i in ids:
                self.store.finish(i, "failed", error=str(e))
            self.metrics.add(failed=len(ids))
            return
        steps = calls[0]["num_inference_steps"]
        compiles0 = self.metrics.compiles
        t_last = [time.perf_counter()]

        def on_step(done: int) -> None:
            now = time.perf_counter()
            self.metrics.observe_step(now - t_last[0])
            t_last[0] = now
            for i in ids:
                self.store.set_progress(i, min(99, done * 100 // steps))
            stop, cancel = self.overdue(), all(i in self.cancelled for i in ids)
            # the other processes end the batch where this one ends it (ditax.serve.group)
            self.share([("halt",) if stop or cancel else ("next",)])
            if stop:
                raise Stopping()
            if cancel:
                raise Cancelled()

        try:
            if self.overdue():
                raise Stopping()
            # after the last check before it runs: the other processes run what this one runs
            self.share([("batch", [j["request"] for j in jobs])])
            strengths = jobs[0]["request"].get("lora_strengths")
            if strengths is not None:     # unmerged LoRAs: only values change, no compile
                self.pipe.transformer.set_lora_strengths(strengths)
            with warnings_said() as said:     # e.g. a prompt cut to the text length
                if self.batching:         # any family's: the generic loop's batch
                    videos = generate_batch(self.pipe, calls, on_step,
                                            pad_to=bucket(len(calls), self.max_batch))
                else:
                    videos = [self.pipe(progress=False, **calls[0],
                                        **self.chunks.hook(self, ids[0], calls[0]))]
        except (Stopping, KeyboardInterrupt):
            raise Stopping() from None
        except Cancelled:
            for i in ids:
                self.store.finish(i, "cancelled")
            self.metrics.add(cancelled=len(ids))
            return
        except Exception as e:  # noqa: BLE001 — the job fails with the reason; the server goes on
            if self.group is not None:    # a lost process, or processes out of step: exit 1
                self.group.after_error(e)
            message = str(e) if isinstance(e, (DitaxError, ValueError)) else \
                f"{type(e).__name__}: {e}"
            self.say(f"jobs {', '.join(ids)} failed: {message}")
            if not isinstance(e, (DitaxError, ValueError)):
                traceback.print_exc()
            for i in ids:
                self.store.finish(i, "failed", error=message)
            self.metrics.add(failed=len(ids))
            return
        compiles = self.metrics.compiles - compiles0
        self.metrics.add(batches=1, batched_jobs=len(jobs))
        for job, video in zip(jobs, videos):
            self.publish(job, video, compiles, about(said, job, len(jobs)))
        timings = getattr(self.pipe, "timings", None)
        self.say(f"{len(jobs)} job(s) done ({timings.line() if timings else 'no timings'}; "
                 f"{compiles} compiles)")

    def publish_later(self, job: dict, video, compiles: int, warnings: list[str],
                      rows: int | None = None) -> None:
        """:meth:`publish` in one of the worker's writer threads (an mp4's encoding is off the
        model thread); the loop waits for them before it ends. ``video`` is copied to the host
        first (the device buffers are the model thread's)."""
        import concurrent.futures

        import numpy as np

        if self.writer is None:
            self.writer = concurrent.futures.ThreadPoolExecutor(
                WRITERS, thread_name_prefix="ditax-serve-writer")
        from ditax.io.audio import AudioTrack

        host = ({k: v if isinstance(v, AudioTrack) else np.asarray(v) for k, v in video.items()}
                if isinstance(video, dict) else np.asarray(video))
        self.pending.add(job["id"])

        def write():
            try:
                self.publish(job, host, compiles, warnings, rows=rows)
            except Exception as e:  # noqa: BLE001 — the job fails with the reason
                traceback.print_exc()
                self.fail_unfinished([job], f"{type(e).__name__}: {e}")
            finally:
                self.pending.discard(job["id"])
        self.writer.submit(write)

    def publish(self, job: dict, video, compiles: int, warnings: list[str],
                rows: int | None = None) -> bool:
        """Write a finished job's output (a temporary file renamed: a file a client may
        download is always whole; a family's further outputs beside it) and mark it
        completed; ``rows``: the most rows it ran beside (its ``batch_size``). False when it
        was cancelled (or, on a shared store, re-claimed by another server) meanwhile: nothing
        of it is kept."""
        from ditax.io.outputs import WriteFailed
        from ditax.io.results import write_result

        if job["id"] in self.cancelled:
            self.store.finish(job["id"], "cancelled")
            self.metrics.add(cancelled=1)
            return False
        from ditax.io.audio import AudioTrack

        extras, more, audio = [], {}, None
        if isinstance(video, dict):       # a family's further outputs (PipelineFamily.outputs)
            main = next(k for k in ("video", "image") if k in video)
            more = {k: v for k, v in video.items() if k != main}
            if isinstance(more.get("audio"), AudioTrack):   # a sound track: into the mp4
                audio = more.pop("audio")
            video = video[main]
        name = f"{job['id']}.{'png' if video.ndim == 3 else 'mp4'}"   # [H, W, 3]: a PNG
        req = job["request"]              # a model made for a frame rate: at it
        try:                              # every file renamed when all are whole
            extras = write_result(self.output_dir / name, video, audio=audio, extras=more,
                                  fps=req.get("frame_rate") or req.get("fps") or 16)
        except OSError as e:              # a full disk, the folder replaced by a file, ...
            self.fail_unfinished([job], str(e) if isinstance(e, WriteFailed) else
                                 f"could not write {self.output_dir / name}: {e}")
            return False
        extra = {} if rows is None else {"batch_size": rows}
        if self.store.finish(job["id"], "completed", file=name, compiles=compiles,
                             warnings=warnings, **extra):
            done = self.store.get(job["id"])
            self.metrics.add(jobs=1, job_seconds=done["finished_at"] - done["created_at"])
            return True
        if self.store.status_of(job["id"]) == "cancelled":   # cancelled while it was written
            for path in [self.output_dir / name, *extras]:
                path.unlink(missing_ok=True)
        # else another server of a shared store completed it (this one's lease had expired):
        # the file is that job's, written from the same request — it stays
        return False


__all__ = ["Cancelled", "Stopping", "Worker"]
