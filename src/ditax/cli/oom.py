"""An out-of-memory at run time, reported in one line: which phase, and what to lower.

XLA reports a failed device (or host) allocation as ``RESOURCE_EXHAUSTED: Out of memory …``
(a ``jax.errors.JaxRuntimeError``); numpy and Python as ``MemoryError``. Either reaching
:func:`ditax.cli.main` becomes ``ditax COMMAND: error: out of memory while PHASE (…): lower
…`` and exit 1 — a failure, not a bad request: the same command may fit on a larger device.

The phase is the one the error left (:func:`ditax.phases.phase_of`: the pipeline marks
``load`` / ``text`` / ``image`` / ``compile`` / ``denoise`` / ``decode``; ``ditax train`` wraps
training in ``train``), refined to ``compile`` when the failing frame is jax compiling a
program (``train`` otherwise becomes ``step``). The advice is per command and phase
(:data:`ADVICE`).
"""

from __future__ import annotations

import os
import re

from ditax.phases import phase_of

_PATTERN = re.compile(r"RESOURCE_EXHAUSTED|out of memory", re.IGNORECASE)
# jax functions that compile (a failure inside them happened while compiling)
_COMPILING = {"compile", "backend_compile", "compile_or_get_cached", "_cached_compilation",
              "backend_compile_and_load"}

DOING = {"load": "loading the model", "text": "encoding the prompt",
         "image": "encoding the image", "compile": "compiling", "denoise": "denoising",
         "decode": "decoding", "step": "running a training step", "train": "training",
         "bench": "benchmarking", "preprocess": "preprocessing"}

_SAMPLE = ("lower --height / --width / --frames, use a memory-lean attention backend "
           "(attention.backend=cudnn, splash or te; or ulysses / ring with mesh.context=N to "
           "split the sequence over devices), sample.cfg_mode=sequential, or "
           "model.dtype=bfloat16")
_TRAIN = ("lower batch_size or the clip size (the dataset's frames / height / width), use "
          "model.remat=full, a memory-lean attention backend (attention.backend=cudnn, splash "
          "or te; ulysses / ring with mesh.context=N), or shard over more devices "
          "(mesh.fsdp=N)")
ADVICE = {
    "load": "load the weights in model.dtype=bfloat16, or shard them over devices "
            "(mesh.fsdp=N or mesh.tensor=N)",
    "text": "lower sample.max_sequence_length, or use model.dtype=bfloat16",
    "image": "lower --height / --width, or use model.dtype=bfloat16",
    "compile": _SAMPLE, "denoise": _SAMPLE,
    "decode": "lower --height / --width / --frames, or decode in tiles (sample.vae_tiling=true)",
    "step": _TRAIN, "train": _TRAIN,
    "bench": "lower --latent F,Y,X or --text-len, or shard over more devices (mesh.*)",
    "preprocess": "lower --height / --width / --frames, --text-len or --batch, or use "
                  "--dtype bfloat16",
}
_BY_COMMAND = {"train": {"compile": _TRAIN}, "train-vae": {"compile": _TRAIN},
               "bench": {"compile": ADVICE["bench"]}}


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def is_out_of_memory(exc: BaseException) -> bool:
    """``exc`` (or one it was raised from) is a failed allocation."""
    return any(isinstance(e, MemoryError) or (isinstance(e, RuntimeError)
                                              and _PATTERN.search(str(e)))
               for e in _chain(exc))


def _compiling(exc: BaseException) -> bool:
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name in _COMPILING and f"{os.sep}jax{os.sep}" in code.co_filename:
            return True
        tb = tb.tb_next
    return False


def failed_phase(exc: BaseException, command: str | None = None) -> str | None:
    """The phase the allocation failed in (see the module docstring)."""
    name = phase_of(exc)
    if any(_compiling(e) for e in _chain(exc)):
        return "compile"
    if name == "train" or (name is None and command in ("train", "train-vae")):
        return "step"
    return name


def oom_message(exc: BaseException, command: str | None = None) -> str:
    """The one-line report of an out-of-memory ``exc`` raised by ``command``."""
    name = failed_phase(exc, command)
    first = next((e for e in _chain(exc) if isinstance(e, MemoryError)
                  or _PATTERN.search(str(e))), exc)
    detail = " ".join(str(first).split())[:160] or type(first).__name__
    advice = (_BY_COMMAND.get(command, {}).get(name) or ADVICE.get(name)
              or (_TRAIN if command in ("train", "train-vae") else _SAMPLE))
    doing = DOING.get(name, name or "running")
    return f"out of memory while {doing} ({detail}): {advice}"


__all__ = ["ADVICE", "failed_phase", "is_out_of_memory", "oom_message"]
