"""A pipeline folder's own sampling defaults: ``ditax_sample.json`` beside ``model_index.json``.

Wan's defaults (480x832, 81 frames, 50 steps, guidance 5) suit Wan; a model trained at another
size (the shipped demo model: 64x64, 17 frames) needs its own, or a plain
``pipe(prompt)`` / ``ditax generate --model FOLDER`` samples it at a size it never saw (for the
demo model an 86 GB out-of-memory). So a folder may carry them::

    {"height": 64, "width": 64, "num_frames": 17, "num_inference_steps": 25,
     "guidance_scale": 8.0, "negative_prompt": "", "max_sequence_length": 16}

Every key is optional (:data:`KEYS`; keys starting with ``_`` are comments). The library
(``load_pipeline`` then ``pipe(prompt)``), ``ditax generate`` and ``ditax calibrate-cache`` use
a value from the file wherever the caller gave none; an explicit argument always wins (CLI: a
flag or a ``sample.*`` override / preset). ``fps`` is for writers of the video (``ditax generate
--fps``); the others are the pipeline call's keyword arguments of the same names.

The file is checked when it is read, before any weights: an unknown key or a bad value is a
:class:`~ditax.pipelines.wan.folder.PipelineLoadError` (exit 2) naming the file and the key.
:func:`write_sample_defaults` writes one (the demo recipe does; so can a training export).
"""

from __future__ import annotations

import difflib
import json
import math
import pathlib

from ditax.pipelines.wan.folder import PipelineLoadError

FILE = "ditax_sample.json"

# key -> (kind, rule shown in messages)
KEYS = {
    "height": ("int", "a positive int (pixels)"),
    "width": ("int", "a positive int (pixels)"),
    "num_frames": ("int", "a positive int of the form 4k+1"),
    "num_inference_steps": ("int", "a positive int"),
    "guidance_scale": ("float", "a finite number >= 0"),
    "guidance_scale_2": ("float?", "a finite number >= 0, or null"),
    "negative_prompt": ("str", "a string"),
    "max_sequence_length": ("int", "a positive int (text tokens)"),
    "fps": ("int", "a positive int (frames per second of the written video)"),
}
# the pipeline call's keyword arguments among them (fps is the writer's)
CALL_KEYS = tuple(k for k in KEYS if k != "fps")


def _valid(kind: str, v) -> bool:
    if kind == "float?" and v is None:
        return True
    if isinstance(v, bool):
        return False
    if kind == "int":
        return isinstance(v, int) and v >= 1
    if kind in ("float", "float?"):
        return isinstance(v, (int, float)) and math.isfinite(v) and v >= 0
    return isinstance(v, str)


def check_sample_defaults(values, source) -> dict:
    """``values`` (a dict read from ``source``) checked key by key; returns them without the
    ``_`` comment keys. Raises :class:`PipelineLoadError` naming ``source`` and the key."""
    if not isinstance(values, dict):
        raise PipelineLoadError(f"{source} must hold a JSON object of sampling defaults "
                                f"({', '.join(KEYS)}), not a {type(values).__name__}")
    out = {}
    for key, v in values.items():
        if str(key).startswith("_"):
            continue
        if key not in KEYS:
            close = difflib.get_close_matches(str(key), list(KEYS), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise PipelineLoadError(f"{source}: unknown key {key!r}{hint}; the sampling "
                                    f"defaults are {', '.join(KEYS)}")
        kind, rule = KEYS[key]
        if not _valid(kind, v):
            raise PipelineLoadError(f"{source}: {key}={json.dumps(v)} must be {rule}")
        out[key] = float(v) if kind.startswith("float") and v is not None else v
    return out


def read_sample_defaults(folder) -> dict:
    """The checked defaults of pipeline ``folder`` (``{}`` when it has no :data:`FILE`)."""
    path = pathlib.Path(folder) / FILE
    if not path.is_file():
        return {}
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise PipelineLoadError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start}); "
                                f"rewrite it as a JSON object") from None
    except json.JSONDecodeError as e:
        raise PipelineLoadError(f"{path} line {e.lineno} column {e.colno}: not valid JSON "
                                f"({e.msg}); fix or delete the file") from None
    return check_sample_defaults(values, path)


def write_sample_defaults(folder, values: dict) -> pathlib.Path:
    """Check ``values`` and write them as ``folder/ditax_sample.json``; returns the path."""
    path = pathlib.Path(folder) / FILE
    values = check_sample_defaults(dict(values), path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(values, indent=2) + "\n")
    return path


def check_fits(values: dict, source, spatial: int, temporal: int) -> None:
    """The file's sizes fit the loaded model's grid (``spatial`` pixels per token, frames
    ``temporal·k + 1``); else a :class:`PipelineLoadError` naming the file."""
    from ditax.pipelines.wan.request import check_request

    try:
        check_request("x", values.get("height", spatial), values.get("width", spatial),
                      values.get("num_frames", 1), values.get("num_inference_steps", 1),
                      values.get("guidance_scale", 1.0), values.get("guidance_scale_2"),
                      spatial=spatial, temporal=temporal)
    except ValueError as e:
        raise PipelineLoadError(f"{source}: {e}") from None


__all__ = ["CALL_KEYS", "FILE", "KEYS", "check_fits", "check_sample_defaults",
           "read_sample_defaults", "write_sample_defaults"]
