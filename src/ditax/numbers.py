"""The rule every number of a config obeys, whatever its section: floats are finite, ints fit
the 32-bit integers jax computes with (step counters, sizes, shapes).

A NaN or infinite learning rate, shift or loss weight would train on silently and give NaN
losses (or none at all) hours later; an int past 2**31 overflows where it becomes a jax array
(``OverflowError`` with no key name) or makes sizes no device holds. :func:`check_numbers`
walks a config's dataclasses (nested sections, tuples, Optional fields) and raises one
:class:`~ditax.errors.ConfigError` naming the first such key. Keys named ``seed`` are the
exception: they take ``0 <= seed < 2**32`` (what the data pipeline's shuffle accepts).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ditax.errors import ConfigError

from ditax.intmath import INT_LIMIT, SEED_LIMIT   # int32 range; 32-bit seeds


def _shown(key: str, value, given: dict[str, str] | None) -> str:
    return str((given or {}).get(key, value))


def check_number(key: str, value: Any, given: dict[str, str] | None = None) -> None:
    """Raise :class:`ConfigError` unless ``value`` (a float, an int, a tuple of them, None or
    anything else, which is left alone) obeys the rule of the module docstring."""
    if isinstance(value, (tuple, list)):
        for i, v in enumerate(value):
            check_number(f"{key}[{i}]", v, None)
        return
    if isinstance(value, bool):
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key}={_shown(key, value, given)}: expected a finite number "
                          f"(not nan or inf)")
    if isinstance(value, int):
        if key.split(".")[-1] == "seed":
            if not 0 <= value < SEED_LIMIT:
                raise ConfigError(f"{key}={_shown(key, value, given)}: a seed must be in "
                                  f"[0, 2**32) (0 <= seed <= {SEED_LIMIT - 1})")
        elif not -INT_LIMIT < value < INT_LIMIT:
            raise ConfigError(f"{key}={_shown(key, value, given)} is out of range: config "
                              f"integers must be below 2**31 ({INT_LIMIT - 1}) in size")


def check_numbers(cfg, prefix: str = "", given: dict[str, str] | None = None) -> None:
    """:func:`check_number` of every leaf of the config dataclass ``cfg`` (``given``: the
    override texts by dotted key, shown in messages instead of the parsed values)."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        key = prefix + f.name
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            check_numbers(value, key + ".", given)
        else:
            check_number(key, value, given)


__all__ = ["INT_LIMIT", "SEED_LIMIT", "check_number", "check_numbers"]
