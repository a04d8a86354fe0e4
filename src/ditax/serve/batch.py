"""Several requests of one program shape as one batch, for ``ditax serve``'s worker.

The batching itself belongs to the generic loop (:mod:`ditax.pipelines.batch`: any family's
pipeline that hands out its loop parts — ``prepare(**call)`` — batches; each row's noise is its
own seed's, its text and condition its own, each output decoded alone; a batch of one is the
pipeline's call, bit for bit). This module only adds what a server needs: the padded batch
size (:func:`bucket`) and :func:`generate_batch`, the name the worker, the demo model's test and
the benchmarks call. It knows no family.
"""

from __future__ import annotations

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
                   pad_to: int | None = None) -> list:
    """The outputs of ``calls`` (checked pipeline calls of one program shape: a server's jobs
    of one batch key) as one batch (:func:`ditax.pipelines.batch.sample_batch`), inside the
    pipeline's compile cache; each is what ``pipe(**call)`` returns (a video ``[F, H, W, 3]`` or
    an image ``[H, W, 3]``, float32 in [0, 1]). ``on_step(steps_done)`` after each step;
    ``pad_to``: run that many rows (the padding is neither decoded nor returned).
    ``pipe.timings`` holds the batch's."""
    with compile_cache(pipe.compile_cache):
        return sample_batch(pipe, calls, on_step=on_step, pad_to=pad_to)


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
                  say: Callable[[str], None] | None = None) -> None:
    """Compile what serving ``calls`` runs, at every batch size of :func:`buckets` (each call
    run once per size, its outputs dropped; a pipeline that does not batch: once alone).
    ``say``: one line a size with its seconds, or the size that failed before its exception
    goes on (a warm-up's time and failure, by batch size, in the server's log)."""
    import time

    for call in calls:
        if not batchable(pipe):
            pipe(progress=False, **call)
            continue
        sizes = buckets(max_batch)
        for b in sizes:
            t0 = time.perf_counter()
            try:
                generate_batch(pipe, [call], pad_to=b)
            except BaseException:
                if say is not None:
                    say(f"warm: batch size {b} (of {', '.join(map(str, sizes))}) failed after "
                        f"{time.perf_counter() - t0:.1f} s")
                raise
            if say is not None:
                say(f"warm: batch size {b} in {time.perf_counter() - t0:.1f} s")


__all__ = ["batchable", "bucket", "buckets", "by_strengths", "generate_batch", "warm_programs"]
