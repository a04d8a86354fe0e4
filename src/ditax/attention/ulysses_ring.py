"""``ulysses_ring``: 2-D sequence parallelism — Ulysses inside groups of ``U`` context devices,
ring across the ``C / U`` groups.

Runs on a view of the mesh whose ``context`` axis is reshaped into
``("context_ring", "context_ulysses")`` (same devices, same order), so the Ulysses
all-to-alls stay inside a group of consecutive (fastest-linked) devices and only K/V of
``N / (T U)`` heads travel around the ring. ``out_a2a`` works as in ``ulysses``; in
``shard_major`` the K/V rotate in the kernel's shard-major layout and the merged output
leaves through one leading-axis all-to-all. All three modes give identical values.
"""

from __future__ import annotations

from ditax.attention.context_parallel import (
    check_out_a2a,
    context_size,
    sequence_parallel_attention,
)


def ulysses_ring_attention(q, k, v, *, mesh=None, kv_mask=None, scale=None, local: str = "xla",
                           out_a2a: str = "flat", ulysses_shards: int = 0, block_q: int = 128,
                           block_kv: int = 128, interpret: bool | None = None):
    """q/k/v ``[B, L, N, K]`` (sequence sharded over ``context``) → ``[B, L, N, K]``.

    ``ulysses_shards`` = U, the Ulysses group size (0 = the whole context axis, i.e. plain
    Ulysses); it must divide the context size, and heads per tensor shard must divide by U.
    """
    check_out_a2a(out_a2a)
    C = context_size(mesh)
    U = C if ulysses_shards in (0, None) else int(ulysses_shards)
    if U <= 0 or C % U:
        raise ValueError(f"ulysses_ring: ulysses_shards={ulysses_shards} does not divide "
                         f"mesh.context={C}; choose a divisor of {C}")
    if k.shape[1] != q.shape[1]:
        from ditax.attention.ulysses import _cross

        return _cross(q, k, v, mesh, kv_mask, scale, local, out_a2a, block_q, block_kv,
                      interpret, "ulysses_ring")
    return sequence_parallel_attention(q, k, v, mesh=mesh, kv_mask=kv_mask, scale=scale,
                                       ring=C // U, ulysses=U, local=local, out_a2a=out_a2a,
                                       block_q=block_q, block_kv=block_kv, interpret=interpret,
                                       backend="ulysses_ring")


__all__ = ["ulysses_ring_attention"]
