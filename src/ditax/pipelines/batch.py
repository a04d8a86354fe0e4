"""Several requests of one program shape as one batch through the one loop
(:func:`ditax.pipelines.sampling.sample`), for any family whose pipeline hands out its parts.

A pipeline that batches has ``prepare(**call) -> Prepared``
(:class:`~ditax.pipelines.sampling.Prepared`: one request checked and laid out as the loop's
parts) and runs its own call as ``prepare(...).run()``. :func:`sample_batch` stacks N such
requests on the batch axis:

- noise: each row's own seed's draw (:func:`~ditax.pipelines.sampling.initial_noise` of the
  one-request shape ``[1, ...]``), or the row's given latents; stacked ``[N, ...]``;
- text: each row's (cond[, uncond]) rows laid out ``[cond_1 .. cond_N, uncond_1 .. uncond_N]``
  on every leaf (a pytree: Flux's T5 embeddings and pooled vector), as the CFG step splits them
  (:func:`~ditax.pipelines.denoise.cfg_branches`);
- condition: each row's pytree concatenated leaf by leaf on axis 0 (each array starts with its
  request's own batch axis: ``[1, ...]``, or ``[2, ...]`` for Wan's first-last image pairs,
  which stay adjacent as the image embedder reads them); the families' input rules broadcast
  or double it with the latents for a batched CFG forward
  (:func:`~ditax.pipelines.denoise.cfg_branches`, ``wan/inputs.py``, ``flux/denoiser.py``);
- everything else (sizes, steps, guidance, experts, scheduler, step programs, finalize) must be
  equal across the rows — it is the program's shape or its static arguments — and is the
  first row's; each output is decoded alone by its row's own decode.

A batch of one runs exactly what the pipeline's call runs (same noise values, text, condition,
step program and decode: bit-identical output, tested); a larger batch runs the same arithmetic
on more rows, equal to each request alone within the float rounding of wider matmuls.

Step-cached requests stack like the others when their cache settings are equal (method,
threshold, CFG reuse, numbers: part of the program's key): each request's rule decides per step
for its own row from its own carry entries, the batch runs the blocks on the steps where any row
needs them and a row that decided to skip takes its own cached residual
(:mod:`ditax.pipelines.cache.step_cache`, "Batches"), so each row equals its request alone;
``pipe.last_stats["rows"]`` holds each real row's cache stats. Rows with a ``source``
(video-to-video's clean start) run one by one.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ditax.pipelines.sampling import Prepared, record, sample

# what each row of a batch takes from its own request: its texts and its noise (the image
# contents too, which reach the loop inside its condition); every other value of a call shapes
# the program or its static arguments, so requests batch only when those are equal
ROW_FIELDS = ("prompt", "prompt_2", "negative_prompt", "seed")

# the fields of Prepared that must be equal across the rows (the program's shape and static
# arguments); the ones not named here are per row, or a callable of the row (text, condition,
# decode, prepare_decode, source)
SHARED = ("latent_shape", "num_inference_steps", "guidance_scale", "guidance_scale_2",
          "boundary", "condition_phase", "cfg_mode", "cache", "cache_threshold", "cfg_cache",
          "cache_coefficients", "start_step", "inputs", "scheduler", "finalize")
SAME_OBJECT = ("programs", "mesh")


def batch_key(call: dict, given: Sequence[str] = ()) -> str:
    """The key under which requests share one batch: every value of ``call`` but a row's own
    (:data:`ROW_FIELDS`), those named in ``given`` (per-row inputs such as images) reduced to
    their being given — so equal keys mean equal sizes, frames, steps, guidance values, LoRA
    strengths, step-cache settings (method, threshold, CFG reuse, numbers), ... and one
    condition structure."""
    shape = {k: (True if k in given else v) for k, v in call.items() if k not in ROW_FIELDS}
    return json.dumps(shape, sort_keys=True, default=repr)


def batchable(pipe) -> bool:
    """Whether ``pipe`` batches: it declares ``batches = True`` and hands out a request's loop
    parts (``prepare``). A pipeline whose call is more than one run of its prepared parts (Wan
    Animate's segments; video-to-video's source, set up by its call) declares ``batches =
    False`` and runs its requests one by one through its call, as does one that declares
    nothing."""
    return bool(getattr(pipe, "batches", False)) and callable(getattr(pipe, "prepare", None))


def _same(name: str, a, b) -> bool:
    if name == "sigmas":
        return (a is None) == (b is None) and (a is None or np.array_equal(a, b))
    if name in SAME_OBJECT:
        return a is b
    return a == b


def check_rows(rows: Sequence[Prepared]) -> None:
    """Raise ValueError naming the first part in which ``rows`` differ (they cannot share one
    program: the step-cache settings among them), or when a row cannot be stacked (a source)
    in a batch of more."""
    first = rows[0]
    for p in rows[1:]:
        for name in (*SHARED, *SAME_OBJECT, "sigmas"):
            if not _same(name, getattr(first, name), getattr(p, name)):
                raise ValueError(f"sample_batch: the requests differ in {name} "
                                 f"({getattr(first, name)!r} vs {getattr(p, name)!r}); batch "
                                 f"only requests of one program shape")
        if len(p.experts) != len(first.experts) or any(
                a.graphdef is not b.graphdef or a.params is not b.params
                for a, b in zip(p.experts, first.experts)):
            raise ValueError("sample_batch: the requests run different experts")
    if len(rows) > 1:
        if any((p.decode is None) != (first.decode is None) for p in rows):
            raise ValueError("sample_batch: some requests ask for latents, others for the "
                             "decoded output; batch only one kind")
        if any(p.source is not None for p in rows):
            raise ValueError("sample_batch: requests with a source (video-to-video) run one "
                             "at a time")


def stack_text(rows: Sequence[Prepared]) -> Callable[[bool], object]:
    """``text(use_cfg)`` of the batch: each leaf ``[cond_1 .. cond_N(, uncond_1 .. uncond_N)]``
    (one row's text is ``[2, ...]`` (cond, uncond) with guidance, else ``[1, ...]``)."""
    def text(use_cfg: bool):
        parts = [p.text(use_cfg) for p in rows]

        def lay_out(*leaves):
            cond = [a[0:1] for a in leaves]
            return jnp.concatenate(cond + ([a[1:2] for a in leaves] if use_cfg else []))
        return jax.tree.map(lay_out, *parts)
    return text


def stack_condition(rows: Sequence[Prepared]) -> Callable[[], object]:
    """``condition()`` of the batch: the rows' pytrees concatenated leaf by leaf on axis 0
    (None when the rows have none)."""
    def condition():
        parts = [p.condition() for p in rows]
        if all(c is None for c in parts):
            return None
        try:
            return jax.tree.map(lambda *a: jnp.concatenate(a), *parts)
        except (ValueError, TypeError) as e:
            raise ValueError(f"sample_batch: the requests' conditions differ in structure or "
                             f"shape ({e}); batch only requests of one program shape") from None
    return condition


def sample_batch(pipe, calls: Sequence[dict], on_step: Callable[[int], None] | None = None,
                 pad_to: int | None = None, progress: bool = False, dry: bool = False,
                 decoded: bool = True) -> list:
    """The outputs of ``calls`` (keyword arguments of ``pipe``'s call, ``progress`` aside),
    each what ``pipe(**call)`` returns (Wan: a video ``[F, H, W, 3]``; Flux: an image
    ``[H, W, 3]``; ``output="latent"``: the row's final latents), run as one batch through
    :func:`~ditax.pipelines.sampling.sample` (module docstring). ``pipe`` must be
    :func:`batchable`; the calls must share one program shape (else ValueError naming the part
    that differs). ``pad_to``: run that many rows (the first call repeated; rows are
    independent, and the padding is neither decoded nor returned), so a server compiles one
    step program per padded size. ``on_step(steps_done)`` after each step; ``pipe.last_stats``
    and ``pipe.timings`` hold the batch's. ``dry``: run no step (a warm-up's,
    :func:`~ditax.pipelines.sampling.sample`'s ``dry``); with ``decoded=False`` too, each real
    row's latents are taken as the decode takes them but not decoded, and the result is
    ``[]``."""
    if not batchable(pipe):
        raise ValueError(f"sample_batch: {type(pipe).__name__} hands out no loop parts "
                         f"(prepare); run its requests one by one through its call")
    if not calls:
        return []
    real = len(calls)
    rows = [pipe.prepare(**c) for c in calls]
    rows += [rows[0]] * max(0, (pad_to or real) - real)
    check_rows(rows)
    if len(rows) == 1 and rows[0].source is not None:   # its start is the source, not noise
        return [record(pipe, sample(rows[0], progress=progress, on_step=on_step, dry=dry))]
    first = rows[0]
    one = tuple(first.latent_shape)
    noise = jnp.concatenate([p.noise(p.checked_latents()) for p in rows])
    n = len(rows)

    def decode(x, prepared):
        # each real row alone by its own decode (one row: the latents as the call has them)
        xs = [x] if n == 1 else [x[i:i + 1] for i in range(real)]
        return [p.decode(xi, prepared) for p, xi in zip(rows, xs)] if decoded else []

    stacked = dataclasses.replace(first, latent_shape=(n, *one[1:]), latents=noise,
                                  text=stack_text(rows), condition=stack_condition(rows),
                                  decode=None if first.decode is None else decode)
    done = sample(stacked, progress=progress, on_step=on_step, dry=dry)
    if "rows" in done.stats:   # the step cache's per-row stats: the real rows'
        done.stats["rows"] = done.stats["rows"][:real]
    out = record(pipe, done)
    if first.decode is None:   # the final latents, one [1, ...] array a row
        return [out[i:i + 1] for i in range(real)]
    return out


__all__ = ["ROW_FIELDS", "batch_key", "batchable", "check_rows", "sample_batch", "stack_condition",
           "stack_text"]
