"""``GET /metrics`` of ``ditax serve``: the Prometheus text exposition (format 0.0.4) of the
job store's counts and the worker's :class:`Metrics` (counted here, from jax's monitoring events
and the worker's calls).

Every family has ``# HELP`` and ``# TYPE`` lines; counters end in ``_total``; the step-time
histogram ``ditax_step_seconds`` has cumulative ``_bucket{le=...}`` lines over
:data:`STEP_BUCKETS` and ``+Inf``, then ``_sum`` and ``_count``. Numbers of
the process (compiles, steps, jobs this server finished) are this server's since it started;
``ditax_jobs{status=...}`` and ``ditax_queue_depth`` are the store's (every server on it).
"""

from __future__ import annotations

import threading

from ditax.exec_cache import LOADED as EXECUTABLE_LOADED   # read whole, untraced (ditax's cache)

BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"   # compiled, or read from disk
CACHE_HIT = "/jax/compilation_cache/cache_hits"                   # read from the persistent cache


#: upper bounds (seconds) of the step-time histogram's buckets (``ditax_step_seconds``)
STEP_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    """Counters for ``/metrics``: programs handed to XLA (compiled or read from the persistent
    cache: jax's, or ditax's executables beside it; the reads also counted alone) and their
    seconds, denoising steps and job seconds (submit → finished), batches run, jobs failed /
    retried (claimed again after a stop or an expired lease) / cancelled, the rows of the
    running batch (a gauge) and a histogram of step times (:data:`STEP_BUCKETS`;
    ``step_counts[i]``: steps of at most ``STEP_BUCKETS[i]`` seconds and more than the bound
    before, the last entry past every bound)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.failed = 0
        self.retried = 0
        self.cancelled = 0
        self.running_rows = 0
        self.step_counts = [0] * (len(STEP_BUCKETS) + 1)
        self.compiles = 0
        self.cache_hits = 0
        self.compile_seconds = 0.0
        self.steps = 0
        self.step_seconds = 0.0
        self.jobs = 0
        self.job_seconds = 0.0
        self.batches = 0
        self.batched_jobs = 0

    def on_event(self, event: str, duration: float, **kw) -> None:
        if event in (BACKEND_COMPILE, EXECUTABLE_LOADED):
            with self.lock:
                self.compiles += 1
                self.compile_seconds += duration
                self.cache_hits += event == EXECUTABLE_LOADED

    def on_plain_event(self, event: str, **kw) -> None:
        if event == CACHE_HIT:
            with self.lock:
                self.cache_hits += 1

    def observe_step(self, seconds: float) -> None:
        """One denoising step of ``seconds`` (of the whole running batch)."""
        i = next((k for k, b in enumerate(STEP_BUCKETS) if seconds <= b), len(STEP_BUCKETS))
        with self.lock:
            self.steps += 1
            self.step_seconds += seconds
            self.step_counts[i] += 1

    def add(self, **amounts) -> None:
        with self.lock:
            for k, v in amounts.items():
                setattr(self, k, getattr(self, k) + v)


def number(value) -> str:
    """A sample value as Prometheus writes it (ints plain, floats rounded to the microsecond)."""
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    return repr(round(float(value), 6))


def family(name: str, kind: str, text: str, samples) -> list[str]:
    """The lines of one metric family: ``samples`` ``[(suffix, labels, value)]``."""
    lines = [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
    for suffix, labels, value in samples:
        label = ",".join(f'{k}="{v}"' for k, v in labels.items())
        lines.append(f"{name}{suffix}{'{' + label + '}' if label else ''} {number(value)}")
    return lines


def histogram(name: str, text: str, bounds, counts, total: float) -> list[str]:
    """A histogram family from per-bucket counts (``counts[i]``: observations in bucket
    ``i``, the last one past every bound) and the sum of the observations."""
    samples, seen = [], 0
    for bound, n in zip((*bounds, float("inf")), counts):
        seen += n
        samples.append(("_bucket", {"le": "+Inf" if bound == float("inf") else f"{bound:g}"},
                        seen))
    return family(name, "histogram", text, [*samples, ("_sum", {}, total),
                                            ("_count", {}, seen)])


def metrics_text(state) -> str:
    """The exposition of ``state`` (a :class:`~ditax.serve.app.ServeState`)."""
    m, counts = state.metrics, state.store.counts()
    with m.lock:                          # one consistent reading of the worker's counters
        step_counts, step_seconds = list(m.step_counts), m.step_seconds
    store_retried = getattr(state.store, "retried", None)
    retried = store_retried() if callable(store_retried) else m.retried
    lines = family("ditax_jobs", "gauge", "Jobs in the store by status.",
                   [("", {"status": s}, n) for s, n in counts.items()])
    gauges = (("ready", "1 once the server takes jobs (after its --warm programs are "
               "compiled), else 0.", int(bool(state.ready))),
              ("queue_depth", "Jobs waiting to run.", counts["queued"]),
              ("running_rows", "Jobs in the batch running now (0: idle).", m.running_rows))
    for name, text, value in gauges:
        lines += family(f"ditax_{name}", "gauge", text, [("", {}, value)])
    counters = (
        ("compiles_total", "Programs handed to XLA since the server started: compiled, or read "
         "from the persistent compile cache (a warm program in memory counts nothing).",
         m.compiles),
        ("compile_cache_hits_total", "Of those, the ones read from the persistent compile "
         "cache.", m.cache_hits),
        ("compile_seconds_total", "Seconds spent in XLA compilation.", m.compile_seconds),
        ("steps_total", "Denoising steps run (a batch's step counts once).", m.steps),
        ("jobs_completed_total", "Jobs this server completed since it started.", m.jobs),
        ("jobs_failed_total", "Jobs that failed on this server since it started.", m.failed),
        ("jobs_retried_total", "Jobs claimed again after a stop or an expired lease.", retried),
        ("jobs_cancelled_total", "Jobs cancelled on this server since it started.",
         m.cancelled),
        ("job_seconds_total", "Seconds from submit to completed, summed.", m.job_seconds),
        ("batches_total", "Batches run.", m.batches),
        ("batched_jobs_total", "Jobs run in those batches.", m.batched_jobs))
    for name, text, value in counters:
        lines += family(f"ditax_{name}", "counter", text, [("", {}, value)])
    lines += histogram("ditax_step_seconds", "Seconds of one denoising step (of the whole "
                       "running batch).", STEP_BUCKETS, step_counts, step_seconds)
    return "\n".join(lines) + "\n"


__all__ = ["BACKEND_COMPILE", "CACHE_HIT", "Metrics", "STEP_BUCKETS", "metrics_text"]
