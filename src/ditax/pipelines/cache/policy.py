"""What a step-cache request may be, and the static part of a cached step.

The method names and their default thresholds, the CFG-reuse schedule, the request checks
that do not depend on the model, and :class:`Policy` (hashable: part of the compiled step's
key). The rules themselves are described in :mod:`.step_cache`.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass

import numpy as np

from ditax.errors import RequestError

METHODS = ("first_block", "teacache", "magcache")
CALIBRATE = "calibrate"     # ditax calibrate-cache: every step runs, measurements recorded
DEFAULT_THRESHOLD = {"first_block": 0.05, "teacache": 0.2, "magcache": 0.12}
CFG_REUSE_BELOW = 0.641     # FasterCache's unconditional-skip timestep range (641 of 1000)
CFG_REFRESH_EVERY = 5       # ... evaluating the unconditional branch every 5th step there

# per-step codes in the carry's per_step [N, branches]
REUSED, RAN, SKIPPED = 0, 1, 2


@dataclass(frozen=True)
class Policy:
    """The static part of a cached step (part of the compiled program's key)."""

    method: str | None          # METHODS, CALIBRATE, or None (CFG reuse only)
    cfg_cache: bool
    teacache_input: str = "modulation"


def check_cache_args(cache, cache_threshold, cfg_cache) -> None:
    """Raise :class:`RequestError` for a cache request that is wrong whatever the model."""
    if cache is not None and cache not in METHODS + (CALIBRATE,):
        close = difflib.get_close_matches(str(cache), METHODS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise RequestError(f"cache={cache!r} is not one of {', '.join(METHODS)} (or None for no "
                           f"step caching){hint}")
    if cache_threshold is not None:
        if cache is None or cache == CALIBRATE:
            raise RequestError(f"cache_threshold={cache_threshold} needs a cache method; set "
                               f"cache to one of {', '.join(METHODS)} or drop the threshold")
        if (isinstance(cache_threshold, bool) or not isinstance(cache_threshold, (int, float))
                or not math.isfinite(cache_threshold) or cache_threshold < 0):
            raise RequestError(f"cache_threshold={cache_threshold!r} must be a number >= 0 "
                               f"(None = {DEFAULT_THRESHOLD[cache]} for {cache}; larger skips "
                               f"more steps)")
    if not isinstance(cfg_cache, bool):
        raise RequestError(f"cfg_cache={cfg_cache!r} must be True or False")


def cfg_reuse_steps(timesteps: np.ndarray, num_train_timesteps: int) -> np.ndarray:
    """``[N]`` bool: the steps whose unconditional branch is replaced: timestep below
    :data:`CFG_REUSE_BELOW` x ``num_train_timesteps``, except every
    :data:`CFG_REFRESH_EVERY`-th of those (counting from the first, which refreshes the
    difference)."""
    low = np.asarray(timesteps, np.float64) < CFG_REUSE_BELOW * num_train_timesteps
    out = np.zeros(len(low), bool)
    idx = np.flatnonzero(low)
    out[idx] = np.arange(len(idx)) % CFG_REFRESH_EVERY != 0
    return out


def uncached_stats(num_steps: int, use_cfg: bool, extra: tuple = ()) -> dict:
    """``pipe.last_stats`` of a call without step caching; ``extra``: the further forwards
    each step runs (a family's guidance rule's branches: LTX-2's ``stg``, ``modality``)."""
    names = (("cond", "uncond") if use_cfg else ("cond",)) + tuple(extra)
    every = list(range(num_steps))
    return dict(steps=num_steps, transformer_calls=num_steps * len(names), cache=None,
                cache_threshold=None, cfg_cache=False, cache_numbers=None,
                computed_steps={n: every for n in names}, skipped_steps={n: [] for n in names})


__all__ = ["CALIBRATE", "CFG_REFRESH_EVERY", "CFG_REUSE_BELOW", "DEFAULT_THRESHOLD", "METHODS",
           "Policy", "RAN", "REUSED", "SKIPPED", "check_cache_args", "cfg_reuse_steps",
           "uncached_stats"]
