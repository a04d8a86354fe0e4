"""The step cache's carry: the state that goes into and comes out of every cached step.

A dict of device arrays, zero at the start of a call:

- ``residual [nb, L', D]``: per CFG branch (``nb`` = 1, or 2 with guidance), the blocks'
  residual (tokens after minus tokens before) of the last step that ran them;
- ``per_step [N, nb]`` int32: what each step did per branch (``REUSED`` / ``RAN`` /
  ``SKIPPED`` of :mod:`.policy`);
- ``acc``, ``ratio``, ``run`` ``[nb]``: the method's accumulators (TeaCache's rescaled
  change, MagCache's ratio product / error / steps skipped in a row);
- what the method compares between steps: ``prev`` (first_block: block 0's residual
  ``[nb, L', D]``; teacache: the modulation ``[nb, 6, D]`` (``[nb, L, 6, D]`` with per-token
  timesteps) or the time embedding);
- calibration: the previous modulation / time embedding / output and the per-step
  measurements ``m_* [N, nb]``;
- ``cfg_diff [1, C, F, Y, X]``: ``uncond - cond`` of the last step that ran both (CFG reuse).
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


def embed_shapes(expert, inputs, latents, text, condition, nb: int):
    """Abstract ``(h, mod, temb)`` of the embedding of ``nb`` branches of ``latents [1, C,
    ...]`` with the family's ``condition`` (None: text only); ``expert``: a
    :class:`~ditax.pipelines.sampling.Expert`, ``inputs`` the family's
    :class:`~ditax.models.base.ModelInputs` rule."""
    def embed(params, latents, text, condition):
        model = nnx.merge(expert.graphdef, params)
        lat = jnp.broadcast_to(latents, (nb,) + latents.shape[1:])
        x, tb, extras = inputs(model, condition, lat, jnp.float32(0))
        if nb == 2:
            extras = batch_twice(extras)
        h, ctx = model.embed(x, tb, jnp.zeros((nb,) + text.shape[1:], text.dtype), **extras)
        return h, ctx.mod, ctx.temb
    return jax.eval_shape(embed, expert.params, latents, text, condition)


def init_carry(expert, inputs, policy: Policy, latents, text, condition, nb: int,
               n: int) -> dict:
    """The zero carry of a call of ``n`` steps and ``nb`` branches (see the module doc)."""
    h, mod, temb = embed_shapes(expert, inputs, latents, text, condition, nb)
    z = lambda s, d=jnp.float32: jnp.zeros(s, d)   # noqa: E731
    carry = dict(residual=z(h.shape, h.dtype), per_step=z((n, nb), jnp.int32),
                 acc=z((nb,)), ratio=jnp.ones((nb,), jnp.float32), run=z((nb,), jnp.int32))
    if policy.method == "first_block":
        carry["prev"] = z(h.shape, h.dtype)
    elif policy.method == "teacache":
        carry["prev"] = z((mod if policy.teacache_input == "modulation" else temb).shape)
    elif policy.method == CALIBRATE:
        carry.update(prev_mod=z(mod.shape), prev_temb=z(temb.shape),
                     prev_out=z((nb,) + latents.shape[1:]),
                     **{k: z((n, nb)) for k in MEASURED})
    if policy.cfg_cache:
        carry["cfg_diff"] = z((1,) + latents.shape[1:])
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


__all__ = ["MEASURED", "carry_specs", "constrain_carry", "embed_shapes", "init_carry"]
