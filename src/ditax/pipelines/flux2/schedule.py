"""FLUX.2's sampling schedule: flow-match Euler on ``sigmas = linspace(1, 1/N, N)`` (or the
call's), shifted by the scheduler with FLUX.2's *empirical* ``mu``.

FLUX.1 takes ``mu`` linear in the image token count
(:func:`ditax.schedulers.flow_match.flux_mu`); FLUX.2 fits it to both the token count ``L``
and the step count ``N`` (Black Forest Labs' ``compute_empirical_mu``, as diffusers 0.42):
two lines in ``L``, ``m_10(L) = 8.738e-5 L + 1.898`` (the fit at 10 steps) and
``m_200(L) = 1.693e-4 L + 0.457`` (at 200 steps), interpolated linearly in ``N`` — except past
4300 tokens, where ``m_200`` alone is used. With ``use_dynamic_shifting`` in the folder's
scheduler config (every FLUX.2 folder) the sigmas are then shifted
``e^mu / (e^mu + 1/s - 1)``; without it the scheduler's fixed ``shift`` applies and ``mu`` is
unused, as in diffusers.
"""

from __future__ import annotations

import dataclasses

# (slope, intercept) of mu over the image token count, fitted at 10 and at 200 steps
_FIT_10 = (8.73809524e-05, 1.89833333)
_FIT_200 = (0.00016927, 0.45666666)
_LONG = 4300     # tokens past which the 200-step fit is used for every step count


def empirical_mu(image_seq_len: int, num_steps: int) -> float:
    """FLUX.2's dynamic shift ``mu`` for ``image_seq_len`` generated-image tokens (the
    reference images' tokens do not count) and ``num_steps`` steps (module docstring)."""
    m_200 = _FIT_200[0] * image_seq_len + _FIT_200[1]
    if image_seq_len > _LONG:
        return float(m_200)
    m_10 = _FIT_10[0] * image_seq_len + _FIT_10[1]
    slope = (m_200 - m_10) / 190.0
    return float(slope * num_steps + (m_200 - 200.0 * slope))


def request_scheduler(scheduler, image_seq_len: int, num_steps: int):
    """``scheduler`` (:class:`~ditax.schedulers.flow_match.FlowMatchEulerScheduler`) with this
    request's ``mu`` (:func:`empirical_mu`); unchanged without dynamic shifting."""
    if not scheduler.use_dynamic_shifting:
        return scheduler
    return dataclasses.replace(scheduler, mu=empirical_mu(image_seq_len, num_steps))


__all__ = ["empirical_mu", "request_scheduler"]
