"""Choosing a sampler by short name and rewriting a folder's scheduler config for it.

A pipeline folder names its sampler in ``scheduler/scheduler_config.json``; a user may ask for
another one (``sample.scheduler=unipc|euler``) or another flow shift (``sample.flow_shift``).
:func:`override_config` turns the folder's config dict into the config of what was asked,
keeping the folder's ``num_train_timesteps`` and, unless overridden, its shift.
"""

from __future__ import annotations

from typing import NamedTuple

from ditax.errors import ConfigError


class _Sampler(NamedTuple):
    class_name: str   # diffusers class (scheduler_config ``_class_name``)
    shift_key: str    # its config key for the flow shift
    flow_keys: dict   # what else a fresh config needs to run on the flow-matching schedule


_SAMPLERS = {
    "unipc": _Sampler("UniPCMultistepScheduler", "flow_shift",
                      {"use_flow_sigmas": True, "prediction_type": "flow_prediction"}),
    "euler": _Sampler("FlowMatchEulerDiscreteScheduler", "shift", {}),
}
SCHEDULER_NAMES = tuple(_SAMPLERS)  # what ``sample.scheduler`` / ``scheduler=`` accept
_BY_CLASS_NAME = {s.class_name: s for s in _SAMPLERS.values()}


def check_scheduler_name(scheduler: str | None) -> None:
    """Raise :class:`ConfigError` unless ``scheduler`` is None (the folder's) or a short name."""
    if scheduler is not None and scheduler not in _SAMPLERS:
        raise ConfigError(f"scheduler={scheduler!r} is not one of {', '.join(SCHEDULER_NAMES)} "
                          f"(or None = the folder's)")


def override_config(cfg: dict, scheduler: str | None = None,
                    flow_shift: float | None = None) -> dict:
    """The scheduler config to build: ``cfg`` itself when nothing is overridden; the same
    sampler with ``flow_shift`` set; or sampler ``scheduler`` ("unipc" | "euler") on the
    flow schedule with the folder's ``num_train_timesteps`` and shift (or ``flow_shift``).

    A config whose ``_class_name`` ditax does not implement comes back unchanged (building it
    then raises with the list of implemented samplers).
    """
    if scheduler is None and flow_shift is None:
        return cfg
    check_scheduler_name(scheduler)
    current = cfg.get("_class_name")
    sampler = _SAMPLERS[scheduler] if scheduler else _BY_CLASS_NAME.get(current)
    if sampler is None:
        return cfg
    shift = flow_shift if flow_shift is not None else cfg.get("flow_shift", cfg.get("shift", 1.0))
    if sampler.class_name == current:
        return {**cfg, sampler.shift_key: shift}
    return {"_class_name": sampler.class_name,
            "num_train_timesteps": cfg.get("num_train_timesteps", 1000),
            sampler.shift_key: shift, **sampler.flow_keys}


__all__ = ["SCHEDULER_NAMES", "check_scheduler_name", "override_config"]
