"""The step cache's carry: the state that goes into and comes out of every cached step.

A dict of device arrays, zero at the start of a call, with one *entry* per CFG branch and
request: ``e = nb * n`` entries (``nb`` = 1, or 2 with guidance; ``n`` requests in the batch,
1 for a call), branch-major — ``[cond_1 .. cond_n, uncond_1 .. uncond_n]``, the rows of the
batched CFG forward (:func:`~ditax.pipelines.denoise.cfg_branches`) — so that every request of
a batch keeps the state it would have alone (:func:`entries` maps a forward's branches to
them):

- ``residual [e, L', D]``: the blocks' residual (tokens after minus tokens before) of the last
  step that ran them for that entry;
- ``per_step [N, e]`` int32: what each step did per entry (``REUSED`` / ``RAN`` / ``SKIPPED``
  of :mod:`.policy`);
- ``acc``, ``ratio``, ``run`` ``[e]``: the method's accumulators (TeaCache's rescaled
  change, MagCache's ratio product / error / steps skipped in a row);
- what the method compares between steps: ``prev`` (first_block: block 0's residual
  ``[e, L', D]``; teacache: the modulation ``[e, 6, D]`` (``[e, L, 6, D]`` with per-token
  timesteps) or the time embedding);
- calibration: the previous modulation / time embedding / output and the per-step
  measurements ``m_* [N, e]``;
- ``cfg_diff [n, C, F, Y, X]``: per request, ``uncond - cond`` of the last step that ran both
  (CFG reuse).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from ditax.parallel.rules import activation_spec
from ditax.pipelines.cache.policy import CALIBRATE, Policy
from ditax.pipelines.denoise import batch_twice

TOKENS = ("act_batch", "act_seq", "act_embed")
MEASURED = ("m_modulation", "m_time_embedding", "m_output", "m_ratio")


def entries(branches: slice, n: int) -> slice:
    """The carry entries of the CFG branches ``branches`` (``COND``, ``UNCOND`` or ``BOTH`` of
    :mod:`ditax.pipelines.denoise`) for a batch of ``n`` requests: a forward over those
    branches has exactly these rows, in this order."""
    return slice(branches.start * n, branches.stop * n)


def embed_shapes(expert, inputs, latents, text, condition, nb: int):
    """Abstract ``(h, mod, temb)`` of the embedding of ``nb`` branches of ``latents [n, C,
    ...]`` with the family's ``condition`` (None: text only) and ``text`` (``nb * n`` rows, as
    the step takes it), laid out as the batched CFG forward; ``expert``: a
    :class:`~ditax.pipelines.sampling.Expert`, ``inputs`` the family's
    :class:`~ditax.models.base.ModelInputs` rule."""
    def embed(params, latents, text, condition):
        model = nnx.merge(expert.graphdef, params)
        x, tb, extras = inputs(model, condition, latents, jnp.float32(0))
        if nb == 2:
            x, tb, extras = batch_twice((x, tb, extras))
        h, ctx = model.embed(x, tb, text, **extras)
        return h, ctx.mod, ctx.temb
    return jax.eval_shape(embed, expert.params, latents, text, condition)


def init_carry(expert, inputs, policy: Policy, latents, text, condition, nb: int,
               n: int) -> dict:
    """The zero carry of ``n`` steps, ``nb`` branches and the requests of ``latents [n_req,
    C, ...]`` (see the module doc)."""
    h, mod, temb = embed_shapes(expert, inputs, latents, text, condition, nb)
    e = nb * latents.shape[0]                      # entries: one per branch and request
    z = lambda s, d=jnp.float32: jnp.zeros(s, d)   # noqa: E731
    carry = dict(residual=z(h.shape, h.dtype), per_step=z((n, e), jnp.int32),
                 acc=z((e,)), ratio=jnp.ones((e,), jnp.float32), run=z((e,), jnp.int32))
    if policy.method == "first_block":
        carry["prev"] = z(h.shape, h.dtype)
    elif policy.method == "teacache":
        carry["prev"] = z((mod if policy.teacache_input == "modulation" else temb).shape)
    elif policy.method == CALIBRATE:
        carry.update(prev_mod=z(mod.shape), prev_temb=z(temb.shape),
                     prev_out=z((e,) + latents.shape[1:]),
                     **{k: z((n, e)) for k in MEASURED})
    if policy.cfg_cache:
        carry["cfg_diff"] = z(latents.shape)
    return carry


def carry_specs(carry: dict, mesh) -> dict:
    """Token-shaped entries are sharded like the blocks' activations; the rest replicated."""
    tokens = activation_spec(TOKENS, mesh)
    token_shape = carry["residual"].shape
    return {k: tokens if k in ("residual", "prev") and v.shape == token_shape else P()
            for k, v in carry.items()}


def constrain_carry(carry: dict, mesh) -> dict:
    """``carry`` with its :func:`carry_specs` as sharding constraints (unchanged without a
    mesh)."""
    if mesh is None:
        return carry
    specs = carry_specs(carry, mesh)
    return {k: jax.lax.with_sharding_constraint(v, NamedSharding(mesh, specs[k]))
            for k, v in carry.items()}


__all__ = ["MEASURED", "carry_specs", "constrain_carry", "embed_shapes", "entries", "init_carry"]
