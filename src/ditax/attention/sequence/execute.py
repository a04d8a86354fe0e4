"""Executing a :class:`~ditax.attention.sequence.plan.SequencePlan` inside ``jax.shard_map``.

Per device, on the plan's ``ring × ulysses`` grid:

1. Ulysses sequence→heads exchange (``U > 1``): the device now holds its ring group's
   ``U * Lc`` tokens for ``N / (T U)`` heads.
2. Local kernel over those tokens; with ``R > 1`` K/V (and their mask) rotate around the ring
   with ``ppermute`` and the partial results merge by log-sum-exp (online softmax). A kernel
   that ``carries`` (flash) merges inside itself (it continues from the previous step's
   output and lse), so every layout performs the same arithmetic on the same tiles and the
   ``out_a2a`` modes agree bit for bit; other kernels merge with
   :func:`~ditax.attention.sequence.merge.merge_partials` (same layout in ``flat`` and
   ``chunked``, so they agree too).
3. Ulysses heads→sequence exchange in the plan's ``out_a2a`` mode.

On the shard-major kernel path q/k/v enter the flash kernel as ``[U, b, h, Lc, K]`` and its
output leaves through one leading-axis all_to_all (no relayout around the exchange itself).
(A packed ``[U, b, Lc, h·K]`` variant, reading heads as column blocks like the BSHD flash
path, was measured and not kept: at Wan 14B 720p on v6e XLA laid the exchanged arrays out
token-minor around it, 923 MiB of copies per layer against 692 MiB here.)

Padding: a sequence that does not split evenly over the ``R·U`` shards is padded at its end
(tokens move between devices); each shard is then padded *on its device* to the plan's
``shard_length`` (flash: whole blocks), padded keys masked, padded queries dropped — the same
in every ``out_a2a`` mode, so they see the same keys in the same blocks.
"""

from __future__ import annotations

import functools
import logging

import jax
import jax.numpy as jnp

from ditax.attention.sequence.merge import empty_state, ring_loop
from ditax.attention.sequence.plan import SequencePlan
from ditax.attention.sharded import sharded_local_attention
from ditax.intmath import ceil_div
from ditax.parallel import collectives as col

log = logging.getLogger(__name__)
_logged: set = set()


def _log_path(plan: SequencePlan) -> None:
    """``chunked`` is lenient: say once which path it took. Every trace notes the path at
    DEBUG (what ran, not what was planned: it is logged from the branch that runs)."""
    if plan.out_a2a == "chunked" and plan.ulysses > 1:
        key = (plan.backend, plan.kernel_path, plan.local.name)
        if key not in _logged:
            _logged.add(key)
            log.info("%s", plan.describe())


def run_sequence_parallel(plan: SequencePlan, q, k, v, *, kv_mask=None, scale=None):
    """q ``[B, L, N, K]`` (sequence sharded over ``context``), k/v ``[B, Lk, N, K]``,
    kv_mask ``[B, Lk]`` → ``[B, L, N, K]`` in q's dtype, sharded like q."""
    B, L = q.shape[:2]
    if L != plan.length:
        raise ValueError(f"{plan.backend}: the plan is for L={plan.length} tokens, q has {L}; "
                         f"plan again for these inputs")
    if plan.cross:
        log.debug("%s", plan.describe())
        return sharded_local_attention(plan.local, q, k, v, mesh=plan.mesh, kv_mask=kv_mask,
                                       scale=scale, what=f"{plan.backend} cross attention")
    _log_path(plan)
    # Only an uneven split pads the whole sequence (moving tokens between devices); the
    # padding of each shard to whole blocks happens on its device (_shard_padded).
    L_pad = ceil_div(L, plan.ring * plan.ulysses) * plan.ring * plan.ulysses
    mask = kv_mask
    if L_pad != L:
        pad = ((0, 0), (0, L_pad - L), (0, 0), (0, 0))
        q, k, v = jnp.pad(q, pad), jnp.pad(k, pad), jnp.pad(v, pad)
        mask = jnp.ones((B, L), bool) if mask is None else mask
        mask = jnp.pad(mask, ((0, 0), (0, L_pad - L)))
    body = _kernel_path_body if plan.kernel_path else _exchange_body
    body = _shard_padded(functools.partial(body, plan, scale), plan.shard_length)
    x_spec, m_spec = plan.grid.token_spec(), plan.grid.mask_spec()
    args = (q, k, v) + (() if mask is None else (mask,))
    specs = (x_spec,) * 3 + (() if mask is None else (m_spec,))
    out = jax.shard_map(body, mesh=plan.grid.mesh, in_specs=specs, out_specs=x_spec,
                        check_vma=False)(*args)
    return out[:, :L] if L_pad != L else out


def _shard_padded(body, shard_length: int):
    """``body`` on each device's shard padded to ``shard_length`` tokens (zero rows, keys
    masked), its output sliced back. Every out_a2a mode pads the same way, so they see the
    same keys in the same blocks; no token moves to another device (padding the whole
    sequence at its end shifted every shard's tokens: halo permutes and copies per call)."""
    def run(q, k, v, *maybe_mask):
        lc = q.shape[1]
        if lc == shard_length:
            return body(q, k, v, *maybe_mask)
        rows = ((0, 0), (0, shard_length - lc), (0, 0), (0, 0))
        m = maybe_mask[0] if maybe_mask else jnp.ones(q.shape[:2], bool)
        m = jnp.pad(m, ((0, 0), (0, shard_length - lc)))
        o = body(jnp.pad(q, rows), jnp.pad(k, rows), jnp.pad(v, rows), m)
        return o[:, :lc]
    return run


def _exchange_body(plan: SequencePlan, scale, q, k, v, *maybe_mask):
    """Per device: Ulysses exchange (flat or chunked) around the local kernel and ring."""
    log.debug("%s: exchange path (%s)", plan.backend, plan.describe())
    m = maybe_mask[0] if maybe_mask else None
    U, R, lk = plan.ulysses, plan.ring, plan.local
    uly, ring = plan.grid.ulysses_axis, plan.grid.ring_axis
    if U > 1:
        to_heads = (col.seq_to_heads_flat if plan.out_a2a == "flat"
                    else functools.partial(col.seq_to_heads_chunked, num_shards=U))
        q, k, v = (to_heads(x, uly) for x in (q, k, v))
        if m is not None:
            m = col.gather_keep(m, uly).reshape(m.shape[0], -1)
    if R == 1:
        o = lk(q, k, v, m, scale)
    elif lk.entry.carries:                                # flash: merge inside the kernel
        def step(q, kv, prev):
            return lk(q, kv[0], kv[1], kv[2], scale, prev)   # lse [b, h, L] as carried
        init = empty_state(q.shape, (q.shape[0], q.shape[2], q.shape[1]))
        o, _ = ring_loop(step, q, (k, v, m), ring, R, init=init)
    else:
        def step(q, kv, _):
            o, lse = lk(q, kv[0], kv[1], kv[2], scale)
            return o, jnp.swapaxes(lse, 1, 2)               # lse [b, h, L] -> [b, L, h]
        o, _ = ring_loop(step, q, (k, v, m), ring, R)
    o = o.astype(q.dtype)
    if U > 1:
        o = (col.heads_to_seq_flat(o, uly) if plan.out_a2a == "flat"
             else col.heads_to_seq_chunked(o, uly, U))
    return o


def _kernel_path_body(plan: SequencePlan, scale, q, k, v, *maybe_mask):
    """Per device, shard-major path: q/k/v enter the flash kernel as ``[U, b, h, Lc, K]`` and
    its output leaves through one leading-axis all_to_all."""
    from ditax.attention.flash import flash_attention_shard_major

    log.debug("%s: shard-major kernel path (%s)", plan.backend, plan.describe())
    m = maybe_mask[0] if maybe_mask else None
    U, R = plan.ulysses, plan.ring
    uly, ring = plan.grid.ulysses_axis, plan.grid.ring_axis
    if U > 1:
        q5, k5, v5 = (col.seq_to_shard_major(x, uly, U) for x in (q, k, v))
        keep = None if m is None else col.gather_keep(m, uly)           # [b, U, Lc]
    else:
        q5, k5, v5 = (jnp.transpose(x, (0, 2, 1, 3))[None] for x in (q, k, v))
        keep = None if m is None else m[:, None, :]
    fl = functools.partial(flash_attention_shard_major, scale=scale, block_q=plan.block_q,
                           block_kv=plan.block_kv, interpret=plan.interpret)
    if R == 1:
        o5 = fl(q5, k5, v5, kv_keep=keep)
    else:
        def step(q5, kv, prev):                 # the kernel continues from prev (its layout)
            return fl(q5, kv[0], kv[1], kv_keep=kv[2], return_lse=True, o_prev=prev[0],
                      lse_prev=prev[1])
        init = empty_state(q5.shape, q5.shape[:-1])
        o5, _ = ring_loop(step, q5, (k5, v5, keep), ring, R, init=init)
    o5 = o5.astype(q.dtype)
    if U > 1:
        return col.shard_major_to_seq(o5, uly)
    return jnp.transpose(o5[0], (0, 2, 1, 3))


__all__ = ["run_sequence_parallel"]
