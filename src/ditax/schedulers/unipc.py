"""UniPC multistep sampler (predictor-corrector, B(h) variants) on the flow-matching schedule.

Matches diffusers' ``UniPCMultistepScheduler`` as Wan configures it: ``use_flow_sigmas=True``,
``prediction_type="flow_prediction"``, ``predict_x0=True``, ``solver_order`` 1 or 2,
``solver_type`` bh1/bh2, optional ``lower_order_final`` and ``disable_corrector``.

Flow schedule: ``alpha(s) = 1 - s``, ``sigma(s) = s``, half log-SNR ``lam(s) = log(1-s) - log(s)``.
Each step converts the velocity to a data prediction ``x0 = x - s_i * v``, corrects the sample
the previous step produced with that fresh ``x0`` (UniC), then predicts the next sample (UniP)
from the last one or two ``x0``. Step i's order is ``min(order, i + 1, N - i)`` (warm-up, and
lower order at the end when ``lower_order_final``); the corrector at step i reuses step i-1's
order. All of it is arithmetic on the traced step index.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ditax.schedulers._config import read_config
from ditax.schedulers.flow import add_flow_noise, shift_sigma

_DEFAULTS = dict(
    num_train_timesteps=1000, beta_start=0.0001, beta_end=0.02, beta_schedule="linear",
    trained_betas=None, solver_order=2, prediction_type="epsilon", thresholding=False,
    dynamic_thresholding_ratio=0.995, sample_max_value=1.0, predict_x0=True, solver_type="bh2",
    lower_order_final=True, disable_corrector=[], solver_p=None, use_karras_sigmas=False,
    use_exponential_sigmas=False, use_beta_sigmas=False, use_flow_sigmas=False, flow_shift=1.0,
    timestep_spacing="linspace", steps_offset=0, final_sigmas_type="zero",
    rescale_betas_zero_snr=False, use_dynamic_shifting=False, time_shift_type="exponential",
    sigma_min=None, sigma_max=None, shift_terminal=None,
)

_SUPPORTED = {
    "prediction_type": (lambda v: v == "flow_prediction", "'flow_prediction' (Wan)"),
    "use_flow_sigmas": (lambda v: v is True, "true (the flow-matching schedule)"),
    "predict_x0": (lambda v: v is True, "true"),
    "solver_order": (lambda v: v in (1, 2), "1 or 2"),
    # diffusers maps the legacy names midpoint/heun/logrho to bh2
    "solver_type": (lambda v: v in ("bh1", "bh2", "midpoint", "heun", "logrho"), "bh1 | bh2"),
    "final_sigmas_type": (lambda v: v in ("zero", "sigma_min"), "'zero' | 'sigma_min'"),
    "thresholding": (lambda v: not v, "false"),
    "solver_p": (lambda v: v is None, "null"),
    "use_karras_sigmas": (lambda v: not v, "false"),
    "use_exponential_sigmas": (lambda v: not v, "false"),
    "use_beta_sigmas": (lambda v: not v, "false"),
    "use_dynamic_shifting": (lambda v: not v, "false (a fixed flow_shift)"),
    "shift_terminal": (lambda v: not v, "null"),
    "flow_shift": (lambda v: float(v) > 0, "a positive number (Wan: 3.0 at 480p, 5.0 at 720p)"),
    "num_train_timesteps": (lambda v: int(v) > 0, "a positive int"),
    "disable_corrector": (lambda v: all(isinstance(i, int) for i in v), "a list of step indices"),
}


class UniPCState(NamedTuple):
    """Sampler state (a pytree). ``S`` = the latent shape.

    timesteps int32 ``[N]``: what the transformer is fed at each step (diffusers' values).
    sigmas float32 ``[N+1]``: noise level per step, last entry 0 (or sigma_min).
    step_index int32 ``[]``.
    x0_history float32 ``[2, *S]``: data predictions of the two previous steps (older first).
    last_sample float32 ``[*S]``: the sample the previous step started from (for UniC).
    corrector_on bool ``[N]``: whether the corrector may run after step i.
    """

    timesteps: jax.Array
    sigmas: jax.Array
    step_index: jax.Array
    x0_history: jax.Array
    last_sample: jax.Array
    corrector_on: jax.Array


def _lam(s):
    return jnp.log(1.0 - s) - jnp.log(s)


def _phi_terms(s_t, s_s0, bh2: bool):
    """Shared B(h) quantities for a step from noise level ``s_s0`` to ``s_t``."""
    h = _lam(s_t) - _lam(s_s0)
    hh = -h
    h_phi_1 = jnp.expm1(hh)
    h_phi_k = h_phi_1 / hh - 1.0
    b_h = jnp.expm1(hh) if bh2 else hh
    b1 = h_phi_k / b_h
    b2 = (h_phi_k / hh - 0.5) * 2.0 / b_h
    return h, h_phi_1, b_h, b1, b2


@dataclass(frozen=True)
class UniPCScheduler:
    """UniPC on flow sigmas; build with :meth:`from_config`."""

    num_train_timesteps: int = 1000
    flow_shift: float = 1.0
    solver_order: int = 2
    solver_type: str = "bh2"
    lower_order_final: bool = True
    final_sigmas_type: str = "zero"
    disable_corrector: tuple[int, ...] = ()

    @classmethod
    def from_config(cls, cfg: dict) -> "UniPCScheduler":
        """From a diffusers ``UniPCMultistepScheduler`` config dict; unsupported settings raise."""
        c = read_config(cfg, "UniPCMultistepScheduler", _DEFAULTS, _SUPPORTED)
        return cls(num_train_timesteps=int(c["num_train_timesteps"]),
                   flow_shift=float(c["flow_shift"]), solver_order=int(c["solver_order"]),
                   solver_type="bh1" if c["solver_type"] == "bh1" else "bh2",
                   lower_order_final=bool(c["lower_order_final"]),
                   final_sigmas_type=c["final_sigmas_type"],
                   disable_corrector=tuple(c["disable_corrector"]))

    def schedule(self, num_steps: int) -> tuple[np.ndarray, np.ndarray]:
        """Host-side ``(timesteps int32 [N], sigmas float32 [N+1])``, as diffusers computes them
        (float64 shifted sigmas, the first nudged below 1, timesteps truncated to integers)."""
        if not isinstance(num_steps, (int, np.integer)) or num_steps < 1:
            raise ValueError(f"num_steps={num_steps!r}; expected a positive int")
        n_train = self.num_train_timesteps
        s = np.linspace(1.0, 1.0 / n_train, num_steps + 1)[:-1]
        s = shift_sigma(s, self.flow_shift)
        if abs(s[0] - 1.0) < 1e-6:  # keeps log(1 - sigma) finite at the first step
            s[0] -= 1e-6
        timesteps = (s * n_train).astype(np.int64).astype(np.int32)
        last = s[-1] if self.final_sigmas_type == "sigma_min" else 0.0
        sigmas = np.concatenate([s, [last]]).astype(np.float32)
        return timesteps, sigmas

    def set_timesteps(self, num_steps: int, shape=None, dtype=jnp.float32) -> UniPCState:
        """Fresh state for ``num_steps`` steps on latents of ``shape`` (needed for the history
        buffers, so that the state's structure never changes between steps)."""
        if shape is None:
            raise ValueError("UniPCScheduler.set_timesteps needs the latent shape "
                             "(set_timesteps(num_steps, latents.shape)) to size its history")
        timesteps, sigmas = self.schedule(num_steps)
        on = np.ones(num_steps, bool)
        for i in self.disable_corrector:
            if 0 <= i < num_steps:
                on[i] = False
        shape = tuple(shape)
        # host arrays put on the device as they are (jnp.asarray / jnp.zeros compiled a copy or
        # a broadcast program per shape: ~5 small compiles a new step count or latent shape)
        return UniPCState(*jax.device_put((
            timesteps, sigmas, np.zeros((), np.int32), np.zeros((2,) + shape, np.float32),
            np.zeros(shape, np.float32), on)))

    def _order(self, i, n):
        """Predictor order at step ``i`` of ``n`` (traced ``i``)."""
        order = jnp.minimum(self.solver_order, i + 1)
        if self.lower_order_final:
            order = jnp.minimum(order, n - i)
        return order

    def step(self, state: UniPCState, model_output, sample):
        """One sampler step: ``(prev_sample [*S], new_state)``; jittable, step index traced.

        model_output: the transformer's velocity at ``state.timesteps[state.step_index]``.
        Math in float32; ``prev_sample`` has ``sample``'s dtype.
        """
        if sample.shape != state.last_sample.shape or model_output.shape != sample.shape:
            raise ValueError(f"UniPC step: sample {sample.shape} / model_output "
                             f"{model_output.shape} must both have the shape the state was "
                             f"made for, {state.last_sample.shape} (set_timesteps(n, shape))")
        bh2 = self.solver_type == "bh2"
        n = state.timesteps.shape[0]
        i = state.step_index
        sig = state.sigmas
        x = sample.astype(jnp.float32)
        v = model_output.astype(jnp.float32)
        s_i = sig[i]
        x0 = x - s_i * v

        older, newer = state.x0_history[0], state.x0_history[1]

        # UniC: correct the sample the previous step predicted, using this step's x0.
        def correct(x):
            c_order = self._order(i - 1, n)
            s_p, s_pp = sig[i - 1], sig[jnp.maximum(i - 2, 0)]
            h, h_phi_1, b_h, b1, b2 = _phi_terms(s_i, s_p, bh2)
            two = c_order == 2
            rk = jnp.where(two, (_lam(s_pp) - _lam(s_p)) / h, 0.0)
            d1 = (older - newer) / jnp.where(two, rk, 1.0)
            rho0 = jnp.where(two, (b1 - b2) / (1.0 - rk), 0.0)
            rho_t = jnp.where(two, b1 - rho0, 0.5)
            alpha_t = 1.0 - s_i
            base = s_i / s_p * state.last_sample - alpha_t * h_phi_1 * newer
            return base - alpha_t * b_h * (rho0 * d1 + rho_t * (x0 - newer))

        use_corr = (i > 0) & state.corrector_on[jnp.maximum(i - 1, 0)]
        x = jax.lax.cond(use_corr, correct, lambda x: x, x)

        # UniP: predict the next sample from x0 (and the previous x0 at order 2).
        p_order = self._order(i, n)
        s_t = sig[i + 1]
        s_prev = sig[jnp.maximum(i - 1, 0)]
        h, h_phi_1, b_h, _, _ = _phi_terms(s_t, s_i, bh2)
        two = p_order == 2
        rk = (_lam(s_prev) - _lam(s_i)) / h
        d1 = (newer - x0) / jnp.where(two, rk, 1.0)
        alpha_t = 1.0 - s_t
        pred = s_t / s_i * x - alpha_t * h_phi_1 * x0
        pred = pred - alpha_t * b_h * jnp.where(two, 0.5, 0.0) * d1

        new_state = state._replace(step_index=i + 1,
                                   x0_history=jnp.stack([newer, x0]),
                                   last_sample=x)
        return pred.astype(sample.dtype), new_state

    def from_step(self, state: UniPCState, start: int) -> UniPCState:
        """The state of a run that begins at step ``start`` (the first ``start`` steps cut, as
        diffusers' video-to-video does): the tables from ``start`` on, step index 0 — so the
        first kept step is order 1 without a corrector and the final steps lower their order
        as diffusers' does (which counts its history from the first step it runs)."""
        return state._replace(timesteps=state.timesteps[start:], sigmas=state.sigmas[start:],
                              corrector_on=state.corrector_on[start:])

    def add_noise(self, state: UniPCState, sample, noise, index):
        """``(1 - s) * sample + s * noise`` at ``state.sigmas[index]`` (scalar or ``[B]``)."""
        return add_flow_noise(sample, noise, state.sigmas[jnp.asarray(index)])
