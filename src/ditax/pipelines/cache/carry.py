"""The step cache's carry: the state that goes into and comes out of every cached step.

A dict of device arrays, zero at the start of a call, with one *entry* per branch and
request: ``e = nb * n`` entries (``nb`` branches: the conditional one, the unconditional one
with guidance, then the further forwards a family's guide rule runs, its ``extra_branches``
(LTX-2: spatio-temporal guidance, modality isolation); ``n`` requests in the batch, 1 for a
call), branch-major — ``[cond_1 .. cond_n, uncond_1 .. uncond_n, ...]``, the rows of the
batched CFG forward (:func:`~ditax.pipelines.denoise.cfg_branches`) first — so that every
request of a batch keeps the state it would have alone (:func:`entries` maps a forward's
branches to them):

- ``residual [e, L', D]``: the blocks' residual (tokens after minus tokens before) of the last
  step that ran them for that entry; for a denoiser whose tokens are a pytree of streams
  (LTX-2: ``(video [e, L', D], audio [e, La, Da])``) the same pytree, each stream laid out by
  the denoiser's ``token_axes`` (default ``act_batch, act_seq, act_embed``);
- ``per_step [N, e]`` int32: what each step did per entry (``REUSED`` / ``RAN`` / ``SKIPPED``
  of :mod:`.policy`);
- ``acc``, ``ratio``, ``run`` ``[e]``: the method's accumulators (TeaCache's rescaled
  change, MagCache's ratio product / error / steps skipped in a row);
- what the method compares between steps: ``prev`` (first_block: block 0's residual
  ``[e, L', D]``; teacache: the modulation ``[e, 6, D]`` (``[e, L, 6, D]`` with per-token
  timesteps) or the time embedding);
- calibration: the previous modulation / time embedding / output and the per-step
  measurements ``m_* [N, e]``;
- ``cfg_diff [n, C, ...]``: per request, ``uncond - cond`` of the last step that ran both
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
TOKEN_ENTRIES = ("residual", "prev")      # token-shaped entries (first_block's ``prev``)


def token_axes(model):
    """The logical axes of ``model``'s tokens: its ``token_axes`` (a pytree of axis tuples
    shaped like its tokens), or :data:`TOKENS` for one ``[B, L', D]`` array."""
    return getattr(model, "token_axes", TOKENS)


def entries(branches: slice, n: int) -> slice:
    """The carry entries of the branches ``branches`` (``COND``, ``UNCOND`` or ``BOTH`` of
    :mod:`ditax.pipelines.denoise`, or an extra branch's slot) for a batch of ``n`` requests: a
    forward over those branches has exactly these rows, in this order."""
    return slice(branches.start * n, branches.stop * n)


def embed_shapes(expert, inputs, latents, text, condition, nb: int):
    """Abstract ``(h, mod, temb)`` of the embedding of ``nb`` CFG branches of ``latents [n, C,
    ...]`` with the family's ``condition`` (None: text only) and ``text`` (``nb * n`` rows,
    as the step takes it), laid out as the batched CFG forward, and the logical axes of the
    tokens (:func:`token_axes`); ``expert``: a :class:`~ditax.pipelines.sampling.Expert`,
    ``inputs`` the family's :class:`~ditax.models.base.ModelInputs` rule."""
    axes = []

    def embed(params, latents, text, condition):
        model = nnx.merge(expert.graphdef, params)
        axes.append(token_axes(model))
        x, tb, extras = inputs(model, condition, latents, jnp.float32(0))
        if nb == 2:
            x, tb, extras = batch_twice((x, tb, extras))
        h, ctx = model.embed(x, tb, text, **extras)
        return h, ctx.mod, ctx.temb
    return jax.eval_shape(embed, expert.params, latents, text, condition), axes[0]


def init_carry(expert, inputs, policy: Policy, latents, text, condition, nb_cfg: int,
               nb: int, n: int) -> tuple[dict, object]:
    """The zero carry of ``n`` steps, ``nb`` branches (``nb_cfg`` of them CFG's) and the
    requests of ``latents [n_req, C, ...]`` (see the module doc), and the tokens' logical axes
    (:func:`carry_specs`)."""
    (h, mod, temb), axes = embed_shapes(expert, inputs, latents, text, condition, nb_cfg)
    e = nb * latents.shape[0]                      # entries: one per branch and request
    z = lambda s, d=jnp.float32: jnp.zeros(s, d)   # noqa: E731
    every = lambda a, d=None: z((e,) + a.shape[1:], d or a.dtype)   # noqa: E731
    tokens = lambda: jax.tree.map(every, h)        # noqa: E731
    carry = dict(residual=tokens(), per_step=z((n, e), jnp.int32),
                 acc=z((e,)), ratio=jnp.ones((e,), jnp.float32), run=z((e,), jnp.int32))
    if policy.method == "first_block":
        carry["prev"] = tokens()
    elif policy.method == "teacache":
        carry["prev"] = every(mod if policy.teacache_input == "modulation" else temb,
                              jnp.float32)
    elif policy.method == CALIBRATE:
        carry.update(prev_mod=every(mod, jnp.float32), prev_temb=every(temb, jnp.float32),
                     prev_out=z((e,) + latents.shape[1:]),
                     **{k: z((n, e)) for k in MEASURED})
    if policy.cfg_cache:
        carry["cfg_diff"] = z(latents.shape)
    return carry, axes


def carry_specs(carry: dict, mesh, axes=TOKENS) -> dict:
    """Token-shaped entries are sharded like the blocks' activations (``axes``: the tokens'
    logical axes, :func:`token_axes`); the rest replicated."""
    structure = jax.tree.structure(carry["residual"])
    shapes = [a.shape for a in jax.tree.leaves(carry["residual"])]
    tokens = jax.tree.map(lambda _, ax: activation_spec(ax, mesh), carry["residual"], axes)

    def spec(k, v):
        if (k in TOKEN_ENTRIES and jax.tree.structure(v) == structure
                and [a.shape for a in jax.tree.leaves(v)] == shapes):
            return tokens
        return jax.tree.map(lambda _: P(), v)
    return {k: spec(k, v) for k, v in carry.items()}


def constrain_carry(carry: dict, mesh, axes=TOKENS) -> dict:
    """``carry`` with its :func:`carry_specs` as sharding constraints (unchanged without a
    mesh)."""
    if mesh is None:
        return carry
    specs = carry_specs(carry, mesh, axes)
    return {k: jax.tree.map(
        lambda a, s: jax.lax.with_sharding_constraint(a, NamedSharding(mesh, s)), v, specs[k])
        for k, v in carry.items()}


__all__ = ["MEASURED", "TOKENS", "carry_specs", "constrain_carry", "embed_shapes", "entries",
           "init_carry", "token_axes"]
