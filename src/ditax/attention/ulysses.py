"""``ulysses``: DeepSpeed-Ulysses style sequence parallelism over the ``context`` mesh axis.

``shard_map``: all-to-all sequence→heads, the local kernel over the *full* sequence for
``N / (T U)`` heads, all-to-all heads→sequence (``U`` = context size, ``T`` = tensor size).

Output exchange ``out_a2a`` (all three give the same values, bit for bit — the exchanges only
move data and every mode runs the same kernel on the same blocks):

- ``"flat"`` (default): the plain inverse ``all_to_all`` (heads axis ↔ token axis); XLA wraps
  it in relayout copies.
- ``"chunked"`` (lenient): when the shard-major kernel path is eligible (``local="flash"`` and
  the preconditions of ``"shard_major"`` hold) it takes it; otherwise one layout-preserving
  ``all_to_all`` over a reshaped ``(U, chunk)`` leading axis around any local kernel. Which of
  the two ran is logged once.
- ``"shard_major"`` (strict): the flash kernel reads q shard-major ``[U, b, h, Lc, K]`` and
  writes its output in that layout, which the exchange sends as is. Every unmet
  precondition (local kernel, head dim, block sizes, dtype, cross-attention) raises a
  ValueError naming it and the fix; it never runs another mode.

Self-attention (``Lk == Lq``) only; for text K/V (``Lk != Lq``) see
:func:`ditax.attention.context_parallel.cross_attention_sharded`, which this backend uses for
``Lk != Lq`` in ``flat``/``chunked`` modes (no exchange there; ``shard_major`` refuses).
"""

from __future__ import annotations

from ditax.attention.context_parallel import (
    check_out_a2a,
    context_size,
    cross_attention_sharded,
    sequence_parallel_attention,
)


def ulysses_attention(q, k, v, *, mesh=None, kv_mask=None, scale=None, local: str = "xla",
                      out_a2a: str = "flat", block_q: int = 128, block_kv: int = 128,
                      interpret: bool | None = None):
    """q/k/v ``[B, L, N, K]`` (sequence sharded over ``context``) → ``[B, L, N, K]``.

    ``local``: reference | xla | blockwise | splash | flash. ``block_q``/``block_kv``/
    ``interpret`` go to a local kernel that takes them. Heads per tensor shard must divide by
    the context size (else ValueError suggesting ``ulysses_ring``/``ring``).
    """
    check_out_a2a(out_a2a)
    C = context_size(mesh)
    if k.shape[1] != q.shape[1]:
        return _cross(q, k, v, mesh, kv_mask, scale, local, out_a2a, block_q, block_kv,
                      interpret, "ulysses")
    return sequence_parallel_attention(q, k, v, mesh=mesh, kv_mask=kv_mask, scale=scale, ring=1,
                                       ulysses=C, local=local, out_a2a=out_a2a, block_q=block_q,
                                       block_kv=block_kv, interpret=interpret, backend="ulysses")


def _cross(q, k, v, mesh, kv_mask, scale, local, out_a2a, block_q, block_kv, interpret, backend):
    if out_a2a == "shard_major":
        raise ValueError(f"{backend}: out_a2a='shard_major' cannot run for cross-attention "
                         f"(Lq={q.shape[1]} != Lk={k.shape[1]}): text K/V are replicated and "
                         f"there is no Ulysses exchange; use out_a2a='flat' or 'chunked'")
    return cross_attention_sharded(q, k, v, mesh=mesh, kv_mask=kv_mask, scale=scale, local=local,
                                   block_q=block_q, block_kv=block_kv, interpret=interpret)


__all__ = ["ulysses_attention", "cross_attention_sharded"]
