"""Flow-matching Euler sampler: ``x_{i+1} = x_i + (s_{i+1} - s_i) * v``.

Matches diffusers' ``FlowMatchEulerDiscreteScheduler`` with a fixed ``shift``, or with
``use_dynamic_shifting`` (FLUX.1-dev: the exponential time shift
``e^mu / (e^mu + 1/s - 1)`` of each sigma, ``mu`` from the image token count, :func:`flux_mu`,
given per request with :meth:`FlowMatchEulerScheduler.with_mu`), and ``shift_terminal``
(LTX-2: the shifted schedule stretched to end at that sigma); no stochastic sampling.
Its schedule has a quirk reproduced here on purpose: the
smallest training sigma is shifted once when the scheduler is built, and the inference
sigmas spaced down to it are shifted again.

Explicit ``sigmas`` (diffusers' ``set_timesteps(sigmas=...)``) replace the spacing: one value
per step, shifted once. The 4-step distillation LoRAs are sampled that way
(:data:`ditax.pipelines.wan.defaults.SAMPLE_PRESETS`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ditax.schedulers._config import read_config
from ditax.schedulers.flow import add_flow_noise, shift_sigma

_DEFAULTS = dict(
    num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=False, base_shift=0.5,
    max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096, invert_sigmas=False,
    shift_terminal=None, use_karras_sigmas=False, use_exponential_sigmas=False,
    use_beta_sigmas=False, time_shift_type="exponential", stochastic_sampling=False,
)

_SUPPORTED = {
    "shift": (lambda v: float(v) > 0, "a positive number"),
    "num_train_timesteps": (lambda v: int(v) > 0, "a positive int"),
    "time_shift_type": (lambda v: v == "exponential", "exponential"),
    "invert_sigmas": (lambda v: not v, "false"),
    "shift_terminal": (lambda v: v is None or 0.0 <= float(v) < 1.0,
                       "null or a number in [0, 1)"),
    "use_karras_sigmas": (lambda v: not v, "false"),
    "use_exponential_sigmas": (lambda v: not v, "false"),
    "use_beta_sigmas": (lambda v: not v, "false"),
    "stochastic_sampling": (lambda v: not v, "false"),
}


def check_sigmas(sigmas, num_steps: int) -> None:
    """Raise ``ValueError`` unless ``sigmas`` is ``num_steps`` decreasing values in (0, 1]."""
    try:
        values = [float(v) for v in sigmas]
    except (TypeError, ValueError):
        raise ValueError(f"sigmas={sigmas!r} is not a list of numbers") from None
    if len(values) != num_steps:
        raise ValueError(f"sigmas has {len(values)} values but {num_steps} steps were asked; "
                         f"give one sigma per step (or set the steps to {len(values)})")
    if not all(0.0 < v <= 1.0 for v in values) or any(
            b >= a for a, b in zip(values, values[1:])):
        raise ValueError(f"sigmas={values} must decrease strictly within (0, 1] (noise level of "
                         f"each step before the shift, e.g. 1.0, 0.75, 0.5, 0.25)")


def flux_mu(image_seq_len: int, base_seq_len: int = 256, max_seq_len: int = 4096,
            base_shift: float = 0.5, max_shift: float = 1.15) -> float:
    """The dynamic shift ``mu`` of ``image_seq_len`` image tokens: linear from ``base_shift``
    at ``base_seq_len`` tokens to ``max_shift`` at ``max_seq_len`` (FluxPipeline's
    ``calculate_shift``)."""
    m = (max_shift - base_shift) / (max_seq_len - base_seq_len)
    return image_seq_len * m + (base_shift - m * base_seq_len)


class FlowMatchEulerState(NamedTuple):
    """timesteps float32 ``[N]`` (fed to the transformer), sigmas float32 ``[N+1]`` (last 0),
    step_index int32 ``[]``."""

    timesteps: jax.Array
    sigmas: jax.Array
    step_index: jax.Array


@dataclass(frozen=True)
class FlowMatchEulerScheduler:
    """Euler on shifted flow sigmas; build with :meth:`from_config`."""

    num_train_timesteps: int = 1000
    shift: float = 1.0
    use_dynamic_shifting: bool = False
    base_shift: float = 0.5
    max_shift: float = 1.15
    base_image_seq_len: int = 256
    max_image_seq_len: int = 4096
    shift_terminal: float | None = None   # the last sigma the schedule is stretched to
    mu: float | None = None   # the dynamic shift of this request (with_mu)

    def with_mu(self, image_seq_len: int) -> "FlowMatchEulerScheduler":
        """This scheduler with ``mu`` set for ``image_seq_len`` image tokens (unchanged without
        dynamic shifting)."""
        if not self.use_dynamic_shifting:
            return self
        return dataclasses.replace(self, mu=flux_mu(
            image_seq_len, self.base_image_seq_len, self.max_image_seq_len, self.base_shift,
            self.max_shift))

    def _shift(self, sig):
        """The shift of (unshifted) sigmas: dynamic (``mu``) or the fixed ``shift``."""
        if not self.use_dynamic_shifting:
            return shift_sigma(sig, self.shift)
        if self.mu is None:
            raise ValueError("use_dynamic_shifting needs mu: call with_mu(image_seq_len) first")
        e = math.exp(self.mu)
        return e / (e + (1.0 / sig - 1.0))

    def _stretch(self, sig):
        """With ``shift_terminal``: the shifted sigmas stretched so the last is that value
        (``1 - (1 - s) (1 - terminal) / (1 - s_last)``, LTX's schedules); else unchanged."""
        if not self.shift_terminal:
            return sig
        one = sig.dtype.type(1.0)   # in the sigmas' own precision, as the reference
        one_minus = one - sig
        if one_minus[-1] == 0:
            raise ValueError(f"shift_terminal={self.shift_terminal} stretches the schedule to "
                             f"end at that sigma, but its last sigma is 1 (a single step): "
                             f"nothing to stretch; sample with 2 steps or more")
        return one - one_minus / (one_minus[-1] / sig.dtype.type(1.0 - self.shift_terminal))

    @classmethod
    def from_config(cls, cfg: dict) -> "FlowMatchEulerScheduler":
        """From a diffusers ``FlowMatchEulerDiscreteScheduler`` config; unsupported settings raise."""
        c = read_config(cfg, "FlowMatchEulerDiscreteScheduler", _DEFAULTS, _SUPPORTED)
        return cls(num_train_timesteps=int(c["num_train_timesteps"]), shift=float(c["shift"]),
                   use_dynamic_shifting=bool(c["use_dynamic_shifting"]),
                   base_shift=float(c["base_shift"]), max_shift=float(c["max_shift"]),
                   base_image_seq_len=int(c["base_image_seq_len"]),
                   max_image_seq_len=int(c["max_image_seq_len"]),
                   shift_terminal=(None if c["shift_terminal"] is None
                                   else float(c["shift_terminal"])))

    def schedule(self, num_steps: int, sigmas=None) -> tuple[np.ndarray, np.ndarray]:
        """Host-side ``(timesteps float32 [N], sigmas float32 [N+1])`` as diffusers builds them;
        ``sigmas``: the N unshifted sigmas to use instead of the even spacing."""
        if not isinstance(num_steps, (int, np.integer)) or num_steps < 1:
            raise ValueError(f"num_steps={num_steps!r}; expected a positive int")
        n = self.num_train_timesteps
        if sigmas is not None:
            check_sigmas(sigmas, num_steps)
            sig = self._stretch(self._shift(np.asarray(sigmas, np.float32)).astype(np.float32))
            return sig * np.float32(n), np.concatenate([sig, [0.0]]).astype(np.float32)
        # Training-time extremes, in float32 like the reference's construction.
        train = np.float32(1.0) / np.float32(n), np.float32(n) / np.float32(n)
        # (the training sigmas are shifted at construction only with a fixed shift)
        s_min, s_max = (float(t if self.use_dynamic_shifting else shift_sigma(t, self.shift))
                        for t in train)
        t = np.linspace(s_max * n, s_min * n, num_steps)
        sig = self._stretch(self._shift(t / n)).astype(np.float32)
        timesteps = sig * np.float32(n)
        return timesteps.astype(np.float32), np.concatenate([sig, [0.0]]).astype(np.float32)

    def set_timesteps(self, num_steps: int, shape=None, dtype=jnp.float32,
                      sigmas=None) -> FlowMatchEulerState:
        """Fresh state for ``num_steps`` steps (``shape``/``dtype`` accepted for a common API;
        ``sigmas``: see :meth:`schedule`)."""
        timesteps, sigmas = self.schedule(num_steps, sigmas)
        # host arrays put on the device as they are (jnp.asarray compiled a copy per shape)
        return FlowMatchEulerState(*jax.device_put((timesteps, sigmas, np.zeros((), np.int32))))

    def step(self, state: FlowMatchEulerState, model_output, sample):
        """``(sample + (s_{i+1} - s_i) * v, new_state)``; jittable, step index traced.
        Computed in float32, returned in ``model_output``'s dtype (as the reference)."""
        i = state.step_index
        dt = state.sigmas[i + 1] - state.sigmas[i]
        prev = sample.astype(jnp.float32) + dt * model_output.astype(jnp.float32)
        return prev.astype(model_output.dtype), state._replace(step_index=i + 1)

    def from_step(self, state: FlowMatchEulerState, start: int) -> FlowMatchEulerState:
        """The state of a run that begins at step ``start`` (the first ``start`` steps cut, as
        diffusers' video-to-video does): the tables from ``start`` on, step index 0."""
        return state._replace(timesteps=state.timesteps[start:], sigmas=state.sigmas[start:])

    def add_noise(self, state: FlowMatchEulerState, sample, noise, index):
        """``(1 - s) * sample + s * noise`` at ``state.sigmas[index]`` (diffusers' scale_noise)."""
        return add_flow_noise(sample, noise, state.sigmas[jnp.asarray(index)])
