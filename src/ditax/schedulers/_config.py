"""Strict reading of diffusers scheduler configs: every key is known, every value supported."""

from __future__ import annotations

from typing import Any, Callable


def read_config(cfg: dict, cls_name: str, defaults: dict[str, Any],
                supported: dict[str, tuple[Callable[[Any], bool], str]]) -> dict[str, Any]:
    """Merge ``cfg`` over ``defaults`` and check it.

    ``defaults`` lists every key the diffusers class accepts (keys starting with ``_`` are
    metadata and skipped). ``supported[key] = (predicate, what)`` restricts a value; a failing
    value raises with the key, the value and what ditax supports.
    """
    unknown = sorted(k for k in cfg if not k.startswith("_") and k not in defaults)
    if unknown:
        raise ValueError(f"{cls_name} config has unknown keys {unknown}; known keys are "
                         f"{sorted(defaults)}")
    merged = {**defaults, **{k: v for k, v in cfg.items() if not k.startswith("_")}}
    for key, (ok, what) in supported.items():
        if not ok(merged[key]):
            raise ValueError(f"{cls_name}: {key}={merged[key]!r} is not supported by ditax; "
                             f"supported: {what}. Change it in scheduler_config.json.")
    return merged
