"""Sequence parallelism over the ``context`` mesh axis: ``ulysses``, ``ring``, ``ulysses_ring``.

One engine on a ``(ring R × ulysses U)`` grid of the ``context`` devices (C = R·U):
``ulysses`` is R = 1 (DeepSpeed-Ulysses: all-to-all sequence→heads, local kernel over the
full sequence, all-to-all back), ``ring`` is U = 1 (K/V rotate with ``ppermute``, partials
merge by log-sum-exp), ``ulysses_ring`` is both (Ulysses inside groups of U consecutive
devices, a ring of R groups outside). Each wraps a local kernel (DESIGN rule 5).

Ulysses output exchange ``out_a2a`` — all three give the same values, bit for bit:

- ``"flat"`` (default): the plain inverse ``all_to_all``; XLA wraps it in relayout copies.
- ``"chunked"`` (lenient): the shard-major kernel path when it is eligible (``local="flash"``
  and the preconditions of ``"shard_major"`` hold), else one layout-preserving leading-axis
  ``all_to_all`` around any local kernel; which one ran is logged once.
- ``"shard_major"`` (strict): the flash kernel reads q shard-major ``[U, b, h, Lc, K]`` and
  writes its output in that layout, which the exchange sends as is. Every unmet
  precondition (local kernel, head dim, blocks, dtype, platform, cross-attention) raises a
  ValueError naming it and the fix; it never runs another mode.

A block table (``attention.sparsity``, the local kernel's ``block_table``) needs whole tiles
on each shard: Ulysses' kernel reads it unchanged, a ring's steps read its slice of (own
group, visiting group) and skip the steps that keep no block (:mod:`.sparse_ring`).

``ring`` accepts only ``"flat"``. Cross-attention (``Lk != Lq``: text K/V) runs without any
exchange: queries stay sequence-sharded, K/V are replicated.

Two steps, both public: :func:`plan_sequence_parallel` (pure: shapes, mesh, options →
frozen :class:`SequencePlan`, every rule checked) and :func:`run_sequence_parallel`.
"""

from __future__ import annotations

from ditax.attention.sequence.execute import run_sequence_parallel
from ditax.attention.sequence.merge import merge_partials, ring_loop
from ditax.attention.sequence.plan import SequencePlan, plan_sequence_parallel


def sequence_parallel_attention(backend: str, q, k, v, *, mesh, kv_mask=None, scale=None,
                                options=None, platform=None, head_major: bool = False):
    """Plan and run ``backend`` for these inputs (the registry's entry point); ``head_major``:
    q/k/v and the output are ``[B, N, L, K]``."""
    shape = (q.shape[0], q.shape[2], q.shape[1], q.shape[3]) if head_major else q.shape
    plan = plan_sequence_parallel(backend, mesh, q_shape=shape,
                                  kv_len=k.shape[2 if head_major else 1], dtype=q.dtype,
                                  options=options, platform=platform)
    return run_sequence_parallel(plan, q, k, v, kv_mask=kv_mask, scale=scale,
                                 head_major=head_major)


__all__ = ["SequencePlan", "plan_sequence_parallel", "run_sequence_parallel",
           "sequence_parallel_attention", "merge_partials", "ring_loop"]
