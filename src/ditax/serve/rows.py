"""The continuous batch of ``ditax serve``'s worker: jobs join the running batch between two
steps and leave it at their last (:class:`~ditax.pipelines.continuous.ContinuousBatch`).

Each turn of the worker's loop (:meth:`Rows.tick`) is: claim queued jobs of the running
batch's key into its free rows (``--max-batch`` rows at most), drop the rows of jobs cancelled
since the last step (by this server or, on a shared store, another replica), run one step,
write the outputs of the rows that took their last step. The store is asked (new rows,
cancels, progress written) at most every :data:`SYNC_EVERY` seconds, and at once after a
submission to this server: a small model's steps are shorter than a store's round trip. Rows of one key share one program
shape (size, frames, steps, guidance, condition structure: the store's batch key); their texts,
seeds, images and LoRA strengths are their own.

Policy (``--max-batch`` N, ``--max-wait`` S): a batch takes new rows while it has fewer than N;
a queued job of another key waits until the running batch is empty, but once the oldest such
job has waited S seconds the running batch takes no new rows, so it empties within its rows'
remaining steps and that job runs next. Step-cached requests and pipelines that do not batch
run as before (the lock-step batch of :meth:`Worker.run_jobs`).

What the turn does is a list of operations (``("add", job id, request)``, ``("drop", job
id)``, ``("step",)``) decided by the server that holds the store and applied by
:meth:`Rows.apply`; a server of several processes (:mod:`ditax.serve.group`) hands the same
list to each process, which applies it to its own batch, so every process runs the same
programs in the same order.
"""

from __future__ import annotations

import contextlib
import logging
import time
import traceback

from ditax.errors import DitaxError
from ditax.serve.requests import call_of


@contextlib.contextmanager
def warnings_said():
    """The messages ditax's loggers warn with inside (a list, filled as they come)."""
    said: list[str] = []

    class Handler(logging.Handler):
        def emit(self, record):
            said.append(record.getMessage())

    handler, logger = Handler(logging.WARNING), logging.getLogger("ditax")
    logger.addHandler(handler)
    try:
        yield said
    finally:
        logger.removeHandler(handler)


#: seconds between two turns that ask the store for new rows, cancels and write progress
#: (a job submitted to this server is taken at the next step)
SYNC_EVERY = 0.2


def message(e: Exception) -> str:
    """A job's failure as its error message (a ditax check's words as they are)."""
    return str(e) if isinstance(e, (DitaxError, ValueError)) else f"{type(e).__name__}: {e}"


class Rows:
    """The worker's continuous batch (module docstring): ``worker`` the
    :class:`~ditax.serve.worker.Worker` it runs for (store, metrics, say, drain)."""

    def __init__(self, worker, max_wait: float = 10.0):
        from ditax.pipelines.continuous import ContinuousBatch

        self.worker, self.max_wait = worker, max_wait
        self.batch = ContinuousBatch(worker.pipe, worker.max_batch)
        self.live: dict[str, dict] = {}      # job id -> {job, compiles, warnings, rows}
        self.key: str | None = None          # the running rows' batch key
        self.synced = 0.0                    # when a turn last asked the store (due)

    @staticmethod
    def takes(job: dict) -> bool:
        """Whether ``job`` runs as a row (not step-cached)."""
        req = job["request"]
        return not (req.get("cache") or req.get("cfg_cache"))

    # --- the operations (every process of a group applies the same list)
    def apply(self, ops: list) -> dict:
        """Apply ``ops`` to the batch; returns ``{"failed": {id: message}, "finished": [(id,
        output)], "warnings": {id: [...]}, "error": exception or None}``."""
        out = {"failed": {}, "finished": [], "warnings": {}, "error": None}
        for op in ops:
            if op[0] == "add":
                _, tag, request = op
                try:
                    with warnings_said() as said:     # e.g. a prompt cut to the text length
                        row = self.batch.prepare(tag, call_of(request),
                                                 request.get("lora_strengths"))
                    self.batch.join(row)
                    out["warnings"][tag] = said
                except Exception as e:  # noqa: BLE001 — this job fails, the batch goes on
                    if not isinstance(e, (DitaxError, ValueError)):
                        traceback.print_exc()
                    out["failed"][tag] = message(e)
            elif op[0] == "drop":
                self.batch.drop(op[1])
            elif op[0] == "step":
                try:
                    out["finished"] = self.batch.step()
                except Exception as e:  # noqa: BLE001 — the rows fail, the worker goes on
                    out["error"] = e
                    self.batch.clear()
        return out

    # --- the server's side: decide, apply, record
    def start(self, jobs: list[dict]) -> None:
        """A first set of claimed jobs (one key) starts the batch; then :meth:`tick`."""
        self.key = jobs[0]["batch_key"]
        self.worker.metrics.add(batches=1)
        self.tick(jobs)

    def holding(self) -> bool:
        """Whether the batch takes no new rows: a job of another key has waited ``max_wait``
        seconds (module docstring)."""
        since = getattr(self.worker.store, "waiting_since", None)
        if since is None or self.key is None:
            return False
        t = since(self.key)
        return t is not None and time.time() - t >= self.max_wait

    def due(self) -> bool:
        """Whether this turn asks the store (new rows, other servers' cancels, progress): at
        most every :data:`SYNC_EVERY` seconds, or at once when a job was submitted here."""
        w = self.worker
        if w.wake.is_set() or time.monotonic() - self.synced >= SYNC_EVERY:
            w.wake.clear()
            self.synced = time.monotonic()
            return True
        return False

    def claim(self) -> list[dict]:
        w = self.worker
        free = self.batch.free
        if w.stopping or free < 1 or self.holding():
            return []
        return w.store.claim(free, batch_key=self.key)

    def tick(self, claimed: list[dict] | None = None) -> None:
        """One turn (module docstring)."""
        w = self.worker
        if w.overdue():
            return self.hand_back()
        sync = claimed is not None or self.due()
        jobs = list(claimed) if claimed is not None else (self.claim() if sync else [])
        w.count_retried(jobs)
        ops: list = [("add", j["id"], j["request"]) for j in jobs]
        now = w.store.statuses(self.live) if self.live and sync else {}
        gone = [i for i in self.live if i in w.cancelled
                or (sync and now.get(i) != "in_progress")]
        ops += [("drop", i) for i in gone]
        ops.append(("step",))
        compiles0 = w.metrics.compiles
        for j in jobs:
            self.live[j["id"]] = {"job": j, "compiles": compiles0, "rows": 0}
        w.metrics.add(batched_jobs=len(jobs))
        for i in gone:
            self.live.pop(i, None)
            if i in w.cancelled or now.get(i) == "cancelled":
                w.metrics.add(cancelled=1)
        ops = w.share(ops)
        t0 = time.perf_counter()
        got = self.apply(ops)
        for i, why in got["failed"].items():
            self.live.pop(i, None)
            w.say(f"job {i} failed: {why}")
            w.store.finish(i, "failed", error=why)
            w.metrics.add(failed=1)
        for i, said in got["warnings"].items():
            if i in self.live:
                self.live[i]["warnings"] = said
        if got["error"] is not None:
            e = got["error"]
            if w.group is not None:       # a lost process, or processes out of step: exit 1
                w.group.after_error(e)
            ids = list(self.live)
            w.say(f"jobs {', '.join(ids)} failed: {message(e)}")
            if not isinstance(e, (DitaxError, ValueError)):
                traceback.print_exception(e)
            for i in ids:
                w.store.finish(i, "failed", error=message(e))
            w.metrics.add(failed=len(ids))
            self.live.clear()
            return self.idle()
        w.metrics.observe_step(time.perf_counter() - t0)
        n = len(self.batch) + len(got["finished"])
        w.metrics.running_rows = n
        progress = {}
        for r in self.batch.rows:
            live = self.live.get(r.tag)
            if live is not None:
                live["rows"] = max(live["rows"], n)
                progress[r.tag] = min(99, r.done * 100 // r.steps)
        if sync:
            w.store.set_progress_many(progress)
        for tag, output in got["finished"]:
            live = self.live.pop(tag, None)
            if live is None:
                continue
            live["rows"] = max(live["rows"], n)
            # written by the worker's writer threads: the next step does not wait for it
            w.publish_later(live["job"], output, w.metrics.compiles - live["compiles"],
                            live.get("warnings", []), rows=live["rows"])
        if got["finished"]:
            timings = w.metrics
            w.say(f"{len(got['finished'])} job(s) done ({len(self.batch)} row(s) running; "
                  f"{timings.compiles} compiles so far)")
        if not self.batch.rows:
            self.idle()

    def idle(self) -> None:
        self.key = None
        self.worker.metrics.running_rows = 0

    def hand_back(self) -> None:
        """The drain is over: every running row's job back to the queue."""
        w = self.worker
        ids = list(self.live)
        w.share([("drop", i) for i in ids])
        for i in ids:
            self.batch.drop(i)
        back = [i for i in ids if w.store.requeue(i)]
        self.live.clear()
        self.idle()
        if back:
            w.say(w.handed_back(back))


__all__ = ["Rows", "message", "warnings_said"]
