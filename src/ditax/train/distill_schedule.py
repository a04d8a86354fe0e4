"""The few-step student's sampling schedule: the sigma table distillation trains it on, and
the pipeline settings that sample it the same way after training.

The student samples with Euler on the flow sigmas ``s_0 > ... > s_{K-1} > s_K = 0``: the run's
``distill.sigmas`` (before the shift) shifted by ``distill.shift`` (0: the family's training
shift at the data's resolution) — the table the pipelines' Euler scheduler builds from the
same ``sigmas`` and shift. Where the scheduler the student will sample with stretches its
schedule to a terminal sigma (LTX-2's ``shift_terminal`` 0.1: the last step runs from 0.1 to 0),
the student trains on that stretched table too: the terminal is read from the ``init_from``
pipeline folder's ``scheduler/scheduler_config.json`` as the student's sampler
(:func:`ditax.schedulers.overrides.override_config` with the settings' ``scheduler``) builds
it, which is the scheduler ``ditax export`` writes into the student's folder (a folder whose
sampler is replaced by a fresh Euler — Wan's UniPC — has none).
"""

from __future__ import annotations

import json
import pathlib

import numpy as np

from ditax.config import Config
from ditax.config.training import distill_sigmas


def student_schedule(sigmas, shift: float, terminal: float | None = None
                     ) -> tuple[np.ndarray, np.ndarray]:
    """``(timesteps [K], sigmas [K+1])`` float32 of a student sampled with Euler on the
    unshifted ``sigmas`` shifted by ``shift`` and stretched to end at ``terminal`` (None:
    not stretched) — the table
    :class:`~ditax.schedulers.flow_match.FlowMatchEulerScheduler` builds for the same call."""
    from ditax.schedulers.flow_match import FlowMatchEulerScheduler

    return FlowMatchEulerScheduler(shift=float(shift), shift_terminal=terminal).schedule(
        len(sigmas), tuple(sigmas))


def student_shift(cfg: Config, family, latent_shape) -> float:
    """``distill.shift``, or (0) the family's training shift at this resolution."""
    if cfg.distill.shift:
        return float(cfg.distill.shift)
    flow = family.training_flow(tuple(latent_shape))
    return float(flow.shift)


def sample_settings(cfg: Config, family, latent_shape) -> dict:
    """The pipeline settings that sample the student as it was trained (``ditax_sample``
    keys, the family's :meth:`~ditax.models.base.ModelFamily.few_step_sample`): Euler on the
    student's sigmas with its shift, no classifier-free guidance. With ``distill.shift`` 0 and
    a resolution-dependent training shift (``flow.dynamic_shift``), no shift is written: the
    pipeline applies the same shift at the sampled resolution. ``latent_shape`` None (an
    export, which knows no resolution): the run's fixed shift. A causal student
    (``distill.method=self_forcing``) adds the KV-cache window it trained with
    (``sample.context_chunks``, when set; else every earlier chunk, nothing written)."""
    d = cfg.distill
    # ditax export builds the family without its flow: the run's config has it
    flow = family.flow if family.flow is not None else cfg.flow
    dynamic = bool(getattr(flow, "dynamic_shift", False))
    if dynamic and not d.shift:
        shift = None
    elif latent_shape is None and not d.shift:      # a fixed shift needs no resolution
        shift = float(flow.shift)
    else:
        shift = student_shift(cfg, family, latent_shape)
    out = family.few_step_sample(d.steps, list(distill_sigmas(d)), shift)
    if d.method == "self_forcing" and cfg.sample.context_chunks is not None:
        out["context_chunks"] = int(cfg.sample.context_chunks)
    return out


def sampling_terminal(cfg: Config, family) -> float | None:
    """The terminal sigma the student's sampler stretches its schedule to: the
    ``shift_terminal`` of the ``init_from`` folder's Euler scheduler as the student's settings
    override it (None: no local pipeline folder, another sampler, or no terminal)."""
    from ditax.schedulers.overrides import override_config

    if not cfg.init_from:
        return None
    f = pathlib.Path(cfg.init_from) / "scheduler" / "scheduler_config.json"
    if not f.is_file():
        return None
    # the sampler the student's settings name (the shift does not change the terminal)
    sampler = family.few_step_sample(cfg.distill.steps, list(distill_sigmas(cfg.distill)),
                                     None).get("scheduler")
    sched = override_config(json.loads(f.read_text()), sampler, None)
    if sched.get("_class_name") != "FlowMatchEulerDiscreteScheduler":
        return None
    terminal = sched.get("shift_terminal")
    return float(terminal) if terminal else None


__all__ = ["sample_settings", "sampling_terminal", "student_schedule", "student_shift"]
