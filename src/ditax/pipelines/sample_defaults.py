"""A pipeline folder's own sampling defaults: ``ditax_sample.json`` beside ``model_index.json``,
for every family.

A family's defaults (Wan: 480x832, 81 frames, 50 steps, guidance 5; FLUX.1: 1024x1024, 28 steps,
guidance 3.5, 512 text tokens) suit its released models; a model trained at another size (the
shipped Wan demo: 64x64, 17 frames; the shipped small Flux: 64x64, 8 text tokens) needs its own,
or a plain ``pipe(prompt)`` / ``ditax generate --model FOLDER`` samples it at a size it never saw
(for the Wan demo an 86 GB out-of-memory; for the small Flux a near-black image). So a folder may
carry them, e.g. the Wan demo's::

    {"height": 64, "width": 64, "num_frames": 17, "num_inference_steps": 25,
     "guidance_scale": 8.0, "negative_prompt": "", "max_sequence_length": 16}

Which keys a file may hold is the family's declaration
(:attr:`ditax.pipelines.family.PipelineFamily.sample_file_keys`; by default the keys of its
``sample_defaults``): Wan's include ``num_frames``, ``guidance_scale_2`` and ``fps``, FLUX.1's
do not. Each key is checked by its rule in :data:`RULES`; a key a family declares that
:data:`RULES` does not know is checked by the type of the family's default (an int: a positive
int; a float: a finite number >= 0; a string: a string). Every key is optional; keys starting
with ``_`` are comments.

The library (``load_pipeline`` then ``pipe(prompt)``), ``ditax generate``, ``ditax
calibrate-cache`` and ``ditax preprocess`` use a value from the file wherever the caller gave
none; an explicit argument always wins (CLI: a flag or a ``sample.*`` override / preset).
``fps`` is for writers of the video (``ditax generate --fps``); the others are the pipeline
call's keyword arguments of the same names.

The file is checked when it is read, before any weights: an unknown key or a bad value is a
:class:`~ditax.errors.PipelineLoadError` (exit 2) naming the file and the key.
:func:`write_sample_defaults` writes one (the demo recipes do; so can a training export).
"""

from __future__ import annotations

import difflib
import json
import math
import pathlib
from typing import Iterable

from ditax.errors import ConfigError, PipelineLoadError

FILE = "ditax_sample.json"

# key -> (kind, rule shown in messages); the order is the order messages list them in
RULES = {
    "height": ("int", "a positive int (pixels)"),
    "width": ("int", "a positive int (pixels)"),
    "num_frames": ("int", "a positive int of the form 4k+1"),
    "num_inference_steps": ("int", "a positive int"),
    "guidance_scale": ("float", "a finite number >= 0"),
    "guidance_scale_2": ("float?", "a finite number >= 0, or null"),
    "negative_prompt": ("str", "a string"),
    "max_sequence_length": ("int", "a positive int (text tokens)"),
    "fps": ("int", "a positive int (frames per second of the written video)"),
    "context_chunks": ("int?", "a positive int (chunks a causal model's KV cache keeps beside "
                               "the sink), or null"),
}
# the sampler settings a LoRA's ``ditax_sample`` may carry beside the keys above (a folder's
# file does not: they are the loader's or need their steps; :mod:`ditax.pipelines.lora_sample`)
SAMPLER_RULES = {
    "true_cfg_scale": ("float", "a finite number >= 0"),
    "scheduler": ("scheduler", "one of euler, unipc"),
    "flow_shift": ("float+", "a finite number > 0"),
    "sigmas": ("sigmas", "a list of numbers, one per step"),
}
# the writers' keys: not arguments of a pipeline call
WRITER_KEYS = ("fps",)
# the pipeline call's keyword arguments among the known keys
CALL_KEYS = tuple(k for k in RULES if k not in WRITER_KEYS)

_BY_TYPE = {int: ("int", "a positive int"), float: ("float", "a finite number >= 0"),
            str: ("str", "a string")}


def rules_for(keys: Iterable[str] | None = None, defaults: dict | None = None) -> dict:
    """``{key: (kind, rule)}`` of the keys a file may hold (``keys``; None: all of
    :data:`RULES`), in :data:`RULES`' order, then the others in the order given; a key
    :data:`RULES` does not know takes the rule of its value's type in ``defaults``."""
    if keys is None:
        return dict(RULES)
    keys = list(keys)
    out = {k: RULES[k] for k in RULES if k in keys}
    for k in keys:
        if k in out:
            continue
        rule = _BY_TYPE.get(type((defaults or {}).get(k)))
        if rule is None:
            raise ConfigError(f"{FILE} key {k!r} has no rule: its default "
                              f"{(defaults or {}).get(k)!r} is not an int, float or string; "
                              f"give the family a default of the key's type")
        out[k] = rule
    return out


def _valid(kind: str, v) -> bool:
    if kind in ("float?", "int?") and v is None:
        return True
    if isinstance(v, bool):
        return False
    if kind in ("int", "int?"):
        return isinstance(v, int) and v >= 1
    if kind in ("float", "float?"):
        return isinstance(v, (int, float)) and math.isfinite(v) and v >= 0
    if kind == "float+":
        return isinstance(v, (int, float)) and math.isfinite(v) and v > 0
    if kind == "sigmas":
        return isinstance(v, (list, tuple)) and bool(v) and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
            for x in v)
    if kind == "scheduler":
        from ditax.schedulers.overrides import SCHEDULER_NAMES

        return v in SCHEDULER_NAMES
    return isinstance(v, str)


def check_sample_defaults(values, source, rules: dict | None = None) -> dict:
    """``values`` (a dict read from ``source``) checked key by key against ``rules``
    (:func:`rules_for`; None: all of :data:`RULES`); returns them without the ``_`` comment
    keys. Raises :class:`PipelineLoadError` naming ``source`` and the key."""
    rules = RULES if rules is None else rules
    if not isinstance(values, dict):
        raise PipelineLoadError(f"{source} must hold a JSON object of sampling defaults "
                                f"({', '.join(rules)}), not a {type(values).__name__}")
    out = {}
    for key, v in values.items():
        if str(key).startswith("_"):
            continue
        if key not in rules:
            close = difflib.get_close_matches(str(key), list(rules), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise PipelineLoadError(f"{source}: unknown key {key!r}{hint}; the sampling "
                                    f"defaults are {', '.join(rules)}")
        kind, rule = rules[key]
        if not _valid(kind, v):
            raise PipelineLoadError(f"{source}: {key}={json.dumps(v)} must be {rule}")
        out[key] = (float(v) if kind.startswith("float") and v is not None else
                    [float(x) for x in v] if kind == "sigmas" else v)
    return out


def read_sample_defaults(folder, rules: dict | None = None) -> dict:
    """The checked defaults of pipeline ``folder`` (``{}`` when it has no :data:`FILE`);
    ``rules``: the family's (:func:`rules_for`; None: all of :data:`RULES`)."""
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
    return check_sample_defaults(values, path, rules)


def write_sample_defaults(folder, values: dict, rules: dict | None = None,
                          stage=None) -> pathlib.Path:
    """Check ``values`` (against ``rules``, as :func:`read_sample_defaults`) and write them as
    ``folder/ditax_sample.json`` whole (:func:`~ditax.io.outputs.atomic_file`; renamed with
    the other outputs of ``stage``, a :class:`~ditax.io.outputs.Staging`, when given);
    returns the path. A failed write is :class:`~ditax.io.outputs.WriteFailed` naming it, and
    a file that was there stays."""
    from ditax.io.outputs import atomic_file

    path = pathlib.Path(folder) / FILE
    text = json.dumps(check_sample_defaults(dict(values), path, rules), indent=2) + "\n"
    with atomic_file(path, stage) as tmp:
        tmp.write_text(text)
    return path


def with_defaults(call: dict, *layers: dict) -> dict:
    """``call`` (keyword arguments of a pipeline call) with each value left at None taken from
    the first of ``layers`` (e.g. the folder's file, then the family's defaults) that has it."""
    out = dict(call)
    for key, value in call.items():
        if value is None:
            out[key] = next((layer[key] for layer in layers if key in layer), None)
    return out


__all__ = ["CALL_KEYS", "FILE", "RULES", "SAMPLER_RULES", "WRITER_KEYS", "check_sample_defaults",
           "read_sample_defaults", "rules_for", "with_defaults", "write_sample_defaults"]
