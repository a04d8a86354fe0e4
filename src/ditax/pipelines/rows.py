"""The rows of a continuous batch (:mod:`ditax.pipelines.continuous`): one request at its own
step (:class:`Row`), what rows must share to run in one step program (:func:`program_key`), the
padded sizes a group of rows runs as (:func:`pad_rows`) and that step program
(:func:`_rows_step`).

The step program is the plain step of :mod:`ditax.pipelines.denoise` with these per row: the
timestep of row ``i`` is ``timesteps[i, step_index[i]]`` (a ``[B]`` timestep into the family's
:class:`~ditax.models.base.ModelInputs` rule), guidance is ``[B]``, each row's LoRA strengths
(``[B, J]``, :func:`ditax.lora.unmerged.row_strengths`), and the scheduler update is the
one-row update mapped over the rows (``jax.vmap``), so a row's result equals its request run
alone within the rounding of a wider matmul. Rows share what shapes the program (the latent
shape, the number of steps and sigmas, guidance on or off and the CFG mode, the scheduler, the
family's rule, the experts and the condition's structure: :func:`program_key`); a group of rows
runs padded (:func:`pad_rows`: 1, 2, 4, then multiples of 4).
"""

from __future__ import annotations

import functools
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ditax.pipelines.denoise import scheduler_update, velocity
from ditax.pipelines.sampling import Prepared


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4))
def _rows_step(gdef, inputs, scheduler, cfg_mode: str, use_cfg: bool, params, states, latents,
               text, guidance, condition=None, strengths=None):
    """One sampling step of ``B`` rows, each at its own step (module docstring).

    ``states``: the rows' scheduler states stacked on axis 0 (each leaf ``[B, ...]``);
    ``latents`` float32 ``[B, ...]``; ``text`` rows ``[cond_1..cond_B(, uncond_1..uncond_B)]``;
    ``guidance`` float32 ``[B]``; ``condition`` the rows' pytrees concatenated (None: text
    only); ``strengths`` float32 ``[B, J]`` (None: the LoRA strengths the model holds).
    Returns ``(latents, states)``."""
    model = nnx.merge(gdef, params)
    rows = latents.shape[0]
    if strengths is not None:       # each row's LoRA strengths, for the forward's rows
        from ditax.lora.unmerged import row_strengths

        row_strengths(model, strengths, rows * (2 if use_cfg and cfg_mode == "batched" else 1))
    t = states.timesteps[jnp.arange(rows), states.step_index].astype(jnp.float32)   # [B]
    step_in = inputs(model, condition, latents, t)
    per_row = guidance.reshape((-1,) + (1,) * (latents.ndim - 1))     # [B, 1, ...]
    v = velocity(model, inputs, cfg_mode, use_cfg, step_in, text, per_row)

    def one(state, v1, x1):          # the one-request update (its own history, step index)
        new, state = scheduler_update(scheduler, state, v1[None], x1[None])
        return new[0], state
    return jax.vmap(one)(states, v, latents)


#: past this many rows a group pads to a multiple of it, not to the next power of two (12
#: rows run as 12, not 16: a padded row costs a whole row's compute)
PAD_STEP = 4


def pad_rows(n: int, most: int, multiple: int = 1) -> int:
    """The rows a group of ``n`` runs as: the next power of two up to :data:`PAD_STEP`, then
    the next multiple of it; at most ``most`` (but at least ``n``), rounded up to a
    ``multiple`` (the mesh's batch shards over the forward's rows per request)."""
    b = 1
    while b < min(n, PAD_STEP):
        b *= 2
    if n > PAD_STEP:
        b = -(-n // PAD_STEP) * PAD_STEP
    b = max(n, min(b, most))
    return -(-b // multiple) * multiple


@dataclass
class Row:
    """One request in a :class:`ContinuousBatch` (module docstring): ``tag`` the caller's
    name for it (a job id), ``done`` its steps run of ``len(timesteps)``."""

    tag: Hashable
    prepared: Prepared
    x: Any
    state: Any
    text: Any
    condition: Any
    timesteps: np.ndarray
    strengths: np.ndarray | None
    done: int = 0
    slot: int = -1            # its place in the batch's arrays (-1: joins at the next step)

    @property
    def steps(self) -> int:
        return len(self.timesteps)

    def low(self) -> bool:
        """Whether this row's next step is the second expert's (below the boundary)."""
        p = self.prepared
        return (p.boundary is not None and len(p.experts) > 1
                and bool(self.timesteps[self.done] < p.boundary))

    def guidance(self) -> float:
        p = self.prepared
        g2 = p.guidance_scale if p.guidance_scale_2 is None else p.guidance_scale_2
        return g2 if self.low() else p.guidance_scale


def _leaf_shapes(tree) -> tuple:
    leaves, structure = jax.tree.flatten(tree)
    return structure, tuple((tuple(a.shape), str(a.dtype)) for a in leaves)


def program_key(p: Prepared, text, condition) -> tuple:
    """What rows must share to run in one step program (module docstring)."""
    sigmas = None if p.sigmas is None else np.asarray(p.sigmas, np.float32).tobytes()
    experts = tuple((id(e.graphdef), id(e.params)) for e in p.experts)
    return (tuple(p.latent_shape), p.num_inference_steps, p.guidance_scale > 1.0, p.cfg_mode,
            p.start_step, sigmas, p.boundary, p.inputs, p.scheduler, p.finalize,
            p.decode is None, id(p.programs), id(p.mesh), experts, _leaf_shapes(text),
            _leaf_shapes(condition))


__all__ = ["PAD_STEP", "Row", "pad_rows", "program_key"]
