"""Sampling schedulers for flow-matching video models, as pure JAX functions.

Each scheduler is a small frozen object built from a diffusers ``scheduler_config.json`` dict:

    sched = from_config(cfg)                       # or load_scheduler(pipeline_folder)
    state = sched.set_timesteps(num_steps, shape)  # pytree of arrays (shape = latent shape)
    for i in range(num_steps):
        t = state.timesteps[state.step_index]      # the value the transformer is fed
        sample, state = step(state, model(sample, t), sample)   # step = jax.jit(sched.step)

``step`` reads the step index from the state (a traced scalar), so one compiled function serves
every step, and the whole loop can be a ``lax.fori_loop`` / ``scan``.
"""

from __future__ import annotations

import pathlib

from ditax.io.files import read_model_json
from ditax.io.hub import resolve_folder
from ditax.schedulers.flow import add_flow_noise, shift_sigma
from ditax.schedulers.flow_match import FlowMatchEulerScheduler, FlowMatchEulerState
from ditax.schedulers.unipc import UniPCScheduler, UniPCState

from ditax.schedulers.overrides import SCHEDULER_NAMES, check_scheduler_name, override_config

SCHEDULERS = {
    "UniPCMultistepScheduler": UniPCScheduler,
    "FlowMatchEulerDiscreteScheduler": FlowMatchEulerScheduler,
}

__all__ = ["SCHEDULERS", "SCHEDULER_NAMES", "FlowMatchEulerScheduler", "FlowMatchEulerState",
           "UniPCScheduler", "UniPCState", "add_flow_noise", "check_scheduler_name",
           "from_config", "load_scheduler", "override_config", "shift_sigma"]


def from_config(cfg: dict):
    """Build the scheduler named by ``cfg["_class_name"]`` from a scheduler config dict."""
    name = cfg.get("_class_name")
    if name not in SCHEDULERS:
        raise ValueError(f"scheduler _class_name={name!r} is not implemented; ditax has "
                         f"{sorted(SCHEDULERS)}. Pick one of those (e.g. pass a config with "
                         "'_class_name': 'UniPCMultistepScheduler').")
    return SCHEDULERS[name].from_config(cfg)


def load_scheduler(path):
    """Read ``scheduler_config.json`` (that file itself, its folder, a pipeline folder's
    ``scheduler/``, or a hub id)."""
    p = pathlib.Path(path)
    if not p.is_file():
        p = resolve_folder(path, "scheduler", required=("scheduler_config.json",)) \
            / "scheduler_config.json"
    return from_config(read_model_json(p, "scheduler config"))
