"""Combining attention partials over disjoint key sets: the log-sum-exp merge and the ring loop.

A partial is ``(o, lse)``: the softmax-normalised output over some keys (float32) and the
log-sum-exp of its scores (-inf where no key was visible).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ditax.parallel import collectives as col


def merge_partials(o1, lse1, o2, lse2):
    """Combine two attention partials over disjoint key sets (float32).

    ``o`` ``[..., K]``, ``lse`` ``[...]``; -inf lse (no visible key) contributes nothing, and
    two empty partials give zeros with lse -inf.

    Exact to rounding, but *which* rounding depends on the layout: XLA CPU rewrites the
    division into a reciprocal multiply and LLVM contracts one of the two products of
    ``w1 o1 + w2 o2`` into an FMA — which one differs between ``[b, L, h, K]`` and
    ``[U, b, h, Lc, K]`` (measured: 1 ulp apart from the first merge on). So the flash
    paths do not use it; they merge inside the kernel (:func:`ring_loop` with ``init``).
    """
    m = jnp.maximum(lse1, lse2)
    m_safe = jnp.where(jnp.isfinite(m), m, 0.0)
    w1, w2 = jnp.exp(lse1 - m_safe), jnp.exp(lse2 - m_safe)
    s = w1 + w2
    nonzero = s > 0
    o = (w1[..., None] * o1 + w2[..., None] * o2) / jnp.where(nonzero, s, 1.0)[..., None]
    lse = jnp.where(nonzero, m_safe + jnp.log(jnp.where(nonzero, s, 1.0)), -jnp.inf)
    return o, lse


def empty_state(o_shape, lse_shape):
    """The online-softmax state before any key: output zeros, log-sum-exp -inf (float32)."""
    return jnp.zeros(o_shape, jnp.float32), jnp.full(lse_shape, -jnp.inf, jnp.float32)


def ring_loop(step, q, kv, axis: str, size: int, init=None, source: bool = False):
    """Run ``step`` for each of the ``size`` K/V chunks of the ring.

    Chunk 0 is the device's own; ``kv`` (a pytree of K, V, mask) then moves one device along
    the ring per step (``size - 1`` ``ppermute`` rounds, none wasted). Returns float32
    ``(o, lse)`` over all chunks.

    Two ways to combine the chunks:

    - ``init=None``: ``step(q, kv, None) -> (o, lse)`` is one chunk's partial and the
      partials merge by log-sum-exp (:func:`merge_partials`);
    - ``init=(o0, lse0)`` (:func:`empty_state`): ``step(q, kv, prev)`` continues the
      online softmax from ``prev`` itself (the flash kernel). Every merge then runs inside the
      kernel on its ``[block_q, K]`` tiles, so the result does not depend on the layout the
      caller keeps ``o`` in — this is what makes the Ulysses ``out_a2a`` modes bit-identical
      for any number of ring steps.

    ``source``: ``step`` takes a fourth argument, the index on ``axis`` of the device whose
    chunk is visiting (int32 scalar, traced: ``(own - s) mod size`` at step ``s``), e.g. to
    pick the block table of (own query chunk, visiting key chunk).
    """
    me = jax.lax.axis_index(axis) if source else None

    def run(kv, prev, s):
        return step(q, kv, prev, (me - s) % size) if source else step(q, kv, prev)

    if init is not None:
        o, lse = run(kv, init, 0)
    else:
        o, lse = run(kv, None, 0)
        o = o.astype(jnp.float32)
    if size == 1:
        return o, lse

    def body(carry, s):
        o, lse, kv = carry
        kv = col.ring_shift(kv, axis, size)
        if init is not None:
            o, lse = run(kv, (o, lse), s)
        else:
            o2, lse2 = run(kv, None, s)
            o, lse = merge_partials(o, lse, o2.astype(jnp.float32), lse2)
        return (o, lse, kv), None

    (o, lse, _), _ = jax.lax.scan(body, (o, lse, kv), jnp.arange(1, size, dtype=jnp.int32),
                                  unroll=2)
    return o, lse


__all__ = ["merge_partials", "empty_state", "ring_loop"]
