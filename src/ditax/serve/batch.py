"""Several requests of one program shape as one batch, for ``ditax serve``'s worker.

The batching itself belongs to the generic loop (:mod:`ditax.pipelines.batch`: any family's
pipeline that hands out its loop parts — ``prepare(**call)`` — batches; each row's noise is its
own seed's, its text and condition its own, each output decoded alone; a batch of one is the
pipeline's call, bit for bit). This module only adds what a server needs: the padded batch
size (:func:`bucket`) and :func:`generate_batch`, the name the worker, the demo model's test and
the benchmarks call. It knows no family.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence

from ditax.compile_cache import compile_cache
from ditax.pipelines.batch import batchable, sample_batch


def bucket(n: int, max_batch: int) -> int:
    """The batch a run of ``n`` jobs is padded to: the next power of two, at most
    ``max_batch`` — so a server compiles one step program per power of two instead of one per
    batch size (1, 2, 4 for ``--max-batch 4``)."""
    b = 1
    while b < n:
        b *= 2
    return max(n, min(b, max_batch))


def generate_batch(pipe, calls: Sequence[dict], on_step: Callable[[int], None] | None = None,
                   pad_to: int | None = None, **dry) -> list:
    """The outputs of ``calls`` (checked pipeline calls of one program shape: a server's jobs
    of one batch key) as one batch (:func:`ditax.pipelines.batch.sample_batch`), inside the
    pipeline's compile cache; each is what ``pipe(**call)`` returns (a video ``[F, H, W, 3]`` or
    an image ``[H, W, 3]``, float32 in [0, 1]). ``on_step(steps_done)`` after each step;
    ``pad_to``: run that many rows (the padding is neither decoded nor returned);
    ``dry``: a warm-up's ``dry=`` / ``decoded=`` (:func:`sample_batch`'s). ``pipe.timings``
    holds the batch's."""
    with compile_cache(pipe.compile_cache):
        return sample_batch(pipe, calls, on_step=on_step, pad_to=pad_to, **dry)


def by_strengths(jobs: list[dict]) -> list[list[dict]]:
    """``jobs`` in groups of equal LoRA strengths (first seen first; a lock-step batch runs
    with one strength vector, a continuous batch with one per row)."""
    groups: dict[str, list[dict]] = {}
    for j in jobs:
        groups.setdefault(repr(j["request"].get("lora_strengths")), []).append(j)
    return list(groups.values())


def buckets(max_batch: int) -> list[int]:
    """Every padded batch size a server with ``--max-batch max_batch`` may run."""
    return sorted({bucket(n, max_batch) for n in range(1, max_batch + 1)})


def warm_programs(pipe, calls: Sequence[dict], max_batch: int,
                  say: Callable[[str], None] | None = None, threads: int = 4) -> None:
    """Compile what serving ``calls`` runs, at every batch size of :func:`buckets` (a pipeline
    that does not batch: each call run once alone). Sizes past one: :func:`warm_dry` (no step
    runs; the step programs compiled ``threads`` at a time); else — ``max_batch`` 1, or a
    step-cached call, whose steps decide per step what runs — each call run once per size, its
    outputs dropped. ``say``: one line a size with its seconds, or the size that failed before
    its exception goes on (a warm-up's time and failure, by batch size, in the server's log)."""
    for call in calls:
        if not batchable(pipe):
            pipe(progress=False, **call)
            continue
        sizes = buckets(max_batch)
        if len(sizes) > 1 and pipe.prepare(**call).cache is None:
            warm_dry(pipe, call, sizes, threads, say)
            continue
        for b in sizes:
            with said_size(b, sizes, say):
                generate_batch(pipe, [call], pad_to=b)


@contextlib.contextmanager
def said_size(b: int, sizes: Sequence[int], say, before: float = 0.0, ok: bool = True,
              note: str = ""):
    """Time the block as batch size ``b``'s warm-up (``before``: its seconds spent earlier) and
    ``say`` its line: its seconds and ``note`` (unless not ``ok``: a part of its warm-up), or
    that it failed (the exception goes on)."""
    t0 = time.perf_counter()
    try:
        yield
    except BaseException:
        if say is not None:
            say(f"warm: batch size {b} (of {', '.join(map(str, sizes))}) failed after "
                f"{before + time.perf_counter() - t0:.1f} s")
        raise
    if say is not None and ok:
        say(f"warm: batch size {b} in {before + time.perf_counter() - t0:.1f} s{note}")


def warm_dry(pipe, call: dict, sizes: Sequence[int], threads: int = 4,
             say: Callable[[str], None] | None = None) -> None:
    """Compile a lock-step batch's programs for ``call`` at each padded size in ``sizes``
    without running a step. For each size, one batch of ``call`` padded to it runs dry
    (:func:`generate_batch` with ``dry=True, decoded=False``: its text, noise, condition,
    scheduler state, finalize and checks at that size, on the very code path of a real batch)
    while its pipeline's :meth:`~ditax.pipelines.programs.Programs.deferring` notes the step
    (and decode) programs; then every noted program is compiled, ``threads`` at a time (1 in a
    multi-process server: its processes compile in one order); then the first two sizes run dry
    again with their row decoded (a batch of one decodes its latents as they are, a larger one
    its row's slice: the same program at every size). A real batch of any of these sizes then
    compiles nothing. ``say``: one line a size, as :func:`warm_programs`' (a size's seconds
    count its own compiles, which ran beside the other sizes')."""
    programs = pipe.prepare(**call).programs
    noted: dict[int, dict] = {}
    seconds: dict[int, float] = {}
    for b in sizes:
        t0 = time.perf_counter()
        with said_size(b, sizes, say, ok=False):
            with programs.deferring() as new:
                generate_batch(pipe, [call], pad_to=b, dry=True, decoded=False)
        seen = {k for n in noted.values() for k in n}
        noted[b] = {k: build for k, build in new.items() if k not in seen}
        seconds[b] = time.perf_counter() - t0
    built = programs.build_all({k: v for n in noted.values() for k, v in n.items()}, threads)
    beside = f" (no step run; {threads} compile threads)" if threads > 1 else " (no step run)"
    for k, b in enumerate(sizes):
        done = [built[key] for key in noted[b]]
        with said_size(b, sizes, say, seconds[b] + sum(s for s, _ in done), note=beside):
            failed = next((e for _, e in done if e is not None), None)
            if failed is not None:
                raise failed
            if k < 2:
                generate_batch(pipe, [call], pad_to=b, dry=True)


__all__ = ["batchable", "bucket", "buckets", "by_strengths", "generate_batch", "warm_dry",
           "warm_programs"]
