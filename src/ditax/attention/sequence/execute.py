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

On the shard-major kernel path q/k/v enter the flash (or, for ``R = 1``, the sage) kernel as
``[U, b, h, Lc, K]`` and its output leaves through one leading-axis all_to_all (no relayout
around the exchange itself).
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
from dataclasses import replace

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from ditax.attention.sequence import exchange as ex
from ditax.attention.sequence.merge import empty_state, ring_loop
from ditax.attention.sequence.plan import SequencePlan
from ditax.attention.sequence.sparse_ring import sparse_ring_step
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


def run_sequence_parallel(plan: SequencePlan, q, k, v, *, kv_mask=None, scale=None,
                          head_major: bool = False):
    """q ``[B, L, N, K]`` (sequence sharded over ``context``), k/v ``[B, Lk, N, K]``,
    kv_mask ``[B, Lk]`` → ``[B, L, N, K]`` in q's dtype, sharded like q.

    ``head_major``: q/k/v and the output are ``[B, N, L, K]`` (what a model's projections
    write for the TPU kernels): flash and splash read it as is, and on the kernel path the
    shards are not padded (the kernel masks their partial last blocks) — the same values,
    bit for bit, in every ``out_a2a`` mode."""
    t = 2 if head_major else 1                               # the token axis
    B, L = q.shape[0], q.shape[t]
    if L != plan.length:
        raise ValueError(f"{plan.backend}: the plan is for L={plan.length} tokens, q has {L}; "
                         f"plan again for these inputs")
    if plan.cross:
        log.debug("%s", plan.describe())
        local = replace(plan.local, head_major=head_major)
        return sharded_local_attention(local, q, k, v, mesh=plan.mesh, kv_mask=kv_mask,
                                       scale=scale, what=f"{plan.backend} cross attention",
                                       head_major=head_major)
    _log_path(plan)
    # Only an uneven split pads the whole sequence (moving tokens between devices); the
    # padding of each shard to whole blocks happens on its device (_shard_padded).
    L_pad = ceil_div(L, plan.ring * plan.ulysses) * plan.ring * plan.ulysses
    mask = kv_mask
    if L_pad != L:
        pad = [(0, L_pad - L) if i == t else (0, 0) for i in range(4)]
        q, k, v = jnp.pad(q, pad), jnp.pad(k, pad), jnp.pad(v, pad)
        mask = jnp.ones((B, L), bool) if mask is None else mask
        mask = jnp.pad(mask, ((0, 0), (0, L_pad - L)))
    body = _kernel_path_body if plan.kernel_path else _exchange_body
    body = functools.partial(body, plan, scale, head_major)
    # Head-major flash on the Ulysses kernel path reads each shard in place, its partial
    # last block masked: no padding. (Flat / chunked exchanges concatenate shards: whole
    # blocks each. The ring pads too: rotated along the ring, unpadded K/V shards of 9,450
    # rows were laid out token-major by XLA and copied back every step at Wan 14B 720p.)
    if not (head_major and plan.kernel_path):
        body = _shard_padded(body, plan.shard_length, t)
    grid = plan.grid
    x_spec = grid.token_spec()
    if head_major:
        x_spec = P(x_spec[0], x_spec[2], x_spec[1], None)
    args = (q, k, v) + (() if mask is None else (mask,))
    specs = (x_spec,) * 3 + (() if mask is None else (grid.mask_spec(),))
    out = jax.shard_map(body, mesh=grid.mesh, in_specs=specs, out_specs=x_spec,
                        check_vma=False)(*args)
    if L_pad == L:
        return out
    return out[:, :, :L] if head_major else out[:, :L]


def _shard_padded(body, shard_length: int, t: int = 1):
    """``body`` on each device's shard padded to ``shard_length`` tokens (zero rows on the
    token axis ``t``, keys masked), its output sliced back. Every out_a2a mode pads the same
    way, so they see the same keys in the same blocks; no token moves to another device
    (padding the whole sequence at its end shifted every shard's tokens: halo permutes and
    copies per call)."""
    def run(q, k, v, *maybe_mask):
        lc = q.shape[t]
        if lc == shard_length:
            return body(q, k, v, *maybe_mask)
        rows = [(0, shard_length - lc) if i == t else (0, 0) for i in range(4)]
        m = maybe_mask[0] if maybe_mask else jnp.ones((q.shape[0], lc), bool)
        m = jnp.pad(m, ((0, 0), (0, shard_length - lc)))
        o = body(jnp.pad(q, rows), jnp.pad(k, rows), jnp.pad(v, rows), m)
        return o[:, :, :lc] if t == 2 else o[:, :lc]
    return run


def _exchanges(plan: SequencePlan, head_major: bool):
    """``(to_heads, to_seq)``: the Ulysses exchange of ``plan.out_a2a`` (flat, or the
    leading-axis chunked one) for the layout."""
    uly, U = plan.grid.ulysses_axis, plan.ulysses
    flat = plan.out_a2a == "flat"
    if head_major:
        if flat:
            return (lambda x: ex.to_heads_flat(x, uly)), (lambda o: ex.from_heads_flat(o, uly))
        return ((lambda x: ex.to_heads_chunked(x, uly, U)),
                (lambda o: ex.from_heads_chunked(o, uly, U)))
    if flat:
        return (lambda x: col.seq_to_heads_flat(x, uly)), (lambda o: col.heads_to_seq_flat(o, uly))
    return ((lambda x: col.seq_to_heads_chunked(x, uly, num_shards=U)),
            (lambda o: col.heads_to_seq_chunked(o, uly, U)))


def _exchange_body(plan: SequencePlan, scale, head_major: bool, q, k, v, *maybe_mask):
    """Per device: Ulysses exchange (flat or chunked) around the local kernel and ring."""
    log.debug("%s: exchange path (%s)", plan.backend, plan.describe())
    m = maybe_mask[0] if maybe_mask else None
    U, R = plan.ulysses, plan.ring
    lk = replace(plan.local, head_major=head_major)
    to_heads, to_seq = _exchanges(plan, head_major)
    if U > 1:
        q, k, v = (to_heads(x) for x in (q, k, v))
        if m is not None:
            m = col.gather_keep(m, plan.grid.ulysses_axis).reshape(m.shape[0], -1)
    b, lq = q.shape[0], q.shape[2 if head_major else 1]
    lse_shape = (b, q.shape[1 if head_major else 2], lq)          # [b, h, L]
    if R == 1:
        o = lk(q, k, v, m, scale)
    elif lk.entry.carries:                                # flash: merge inside the kernel
        def step(run, q, kv, prev):
            return run(q, kv[0], kv[1], kv[2], scale, prev)   # lse [b, h, L] as carried
        o, _ = _ring(plan, step, lk, q, (k, v, m), empty_state(q.shape, lse_shape))
    else:
        def step(run, q, kv, _):
            o, lse = run(q, kv[0], kv[1], kv[2], scale)
            # merge_partials wants lse on o's leading axes: [b, h, L] head-major, [b, L, h]
            return o, lse if head_major else jnp.swapaxes(lse, 1, 2)
        o, _ = _ring(plan, step, lk, q, (k, v, m))
    o = o.astype(q.dtype)
    return to_seq(o) if U > 1 else o


def _ring(plan: SequencePlan, step, lk, q, kv, init=None):
    """The ring loop of ``step(run, q, kv, prev)`` on the local kernel ``lk``; with a block
    table each step runs on the table's slice of (own ring group, visiting group), a step
    that keeps no block on none (:mod:`~ditax.attention.sequence.sparse_ring`)."""
    ring, R = plan.grid.ring_axis, plan.ring
    if plan.ring_tables is None:
        return ring_loop(functools.partial(step, lk), q, kv, ring, R, init=init)
    sparse = sparse_ring_step(step, lk, plan.ring_tables, ring, carries=init is not None)
    return ring_loop(sparse, q, kv, ring, R, init=init, source=True)


def _kernel_path_body(plan: SequencePlan, scale, head_major: bool, q, k, v, *maybe_mask):
    """Per device, shard-major path: q/k/v enter the flash (or sage) kernel as
    ``[U, b, h, Lc, K]`` and its output leaves through one leading-axis all_to_all
    (head-major shards unpadded: the kernel masks their partial last blocks; sage, planned
    for R = 1 only, quantizes each shard in ``cdiv`` blocks)."""
    if plan.local.name == "sage":
        from ditax.attention.sage import sage_attention_shard_major as shard_major_kernel
    else:
        from ditax.attention.flash import flash_attention_shard_major as shard_major_kernel

    log.debug("%s: shard-major kernel path (%s)", plan.backend, plan.describe())
    m = maybe_mask[0] if maybe_mask else None
    U, R = plan.ulysses, plan.ring
    uly, ring = plan.grid.ulysses_axis, plan.grid.ring_axis
    if U > 1:
        if head_major:
            q5, k5, v5 = (ex.to_shard_major(x, uly, U) for x in (q, k, v))
        else:
            q5, k5, v5 = (col.seq_to_shard_major(x, uly, U) for x in (q, k, v))
        keep = None if m is None else col.gather_keep(m, uly)           # [b, U, Lc]
    else:
        q5, k5, v5 = ((x if head_major else jnp.transpose(x, (0, 2, 1, 3)))[None]
                      for x in (q, k, v))
        keep = None if m is None else m[:, None, :]
    fl = functools.partial(shard_major_kernel, scale=scale, block_q=plan.block_q,
                           block_kv=plan.block_kv, interpret=plan.interpret,
                           whole_blocks=not head_major)
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
        return ex.from_shard_major(o5, uly) if head_major else col.shard_major_to_seq(o5, uly)
    return o5[0] if head_major else jnp.transpose(o5[0], (0, 2, 1, 3))


__all__ = ["run_sequence_parallel"]
