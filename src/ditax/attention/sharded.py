"""A local attention kernel on a mesh: ``shard_map`` with queries sharded over batch, sequence
and heads and K/V whole along their sequence.

This is how a local backend runs under a mesh — self-attention of a local backend given a
mesh, and cross-attention of every backend (text K/V are short and replicated over the
sequence axis, so nothing is exchanged). Pallas and cuDNN/TE kernels are opaque to XLA's
partitioner, which would otherwise replicate their inputs on every device. For
self-attention with a sequence-sharded q, K/V are all-gathered at the ``shard_map`` boundary
(``ulysses`` / ``ring`` avoid that). A query length that does not divide the sequence shards
is padded and the padded rows dropped.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from ditax.parallel.axes import (
    batch_entry,
    check_batch_divides,
    check_heads_divide,
    heads_entry,
    seq_entry,
    seq_shards,
)


def sharded_local_attention(kernel, q, k, v, *, mesh, kv_mask=None, scale=None,
                            what: str = "attention", head_major: bool = False):
    """q ``[B, Lq, N, K]`` (sequence-sharded), k/v ``[B, Lk, N, K]``, kv_mask ``[B, Lk]`` →
    ``[B, Lq, N, K]`` sharded like q (``head_major``: q/k/v and the output ``[B, N, L, K]``,
    and ``kernel`` reads that layout).

    ``kernel(q, k, v, kv_mask, scale)`` (e.g. a :class:`~ditax.attention.local.LocalRun`)
    runs per device on ``[B/(data·fsdp), Lq/context, N/tensor, K]`` queries and whole K/V.
    ``what`` names the call in error messages.
    """
    t = 2 if head_major else 1                   # the token axis
    b, lq, n = q.shape[0], q.shape[t], q.shape[3 - t]
    check_batch_divides(b, mesh, f"{what}: batch")
    check_heads_divide(n, mesh, what)
    pad = (-lq) % seq_shards(mesh)
    if pad:
        q = jnp.pad(q, [(0, pad) if i == t else (0, 0) for i in range(4)])
    batch, heads = batch_entry(mesh), heads_entry(mesh)
    if head_major:
        q_spec, kv_spec = P(batch, heads, seq_entry(mesh), None), P(batch, heads, None, None)
    else:
        q_spec, kv_spec = P(batch, seq_entry(mesh), heads, None), P(batch, None, heads, None)

    def body(q, k, v, *m):
        return kernel(q, k, v, m[0] if m else None, scale)

    args = (q, k, v) + (() if kv_mask is None else (kv_mask,))
    specs = (q_spec, kv_spec, kv_spec) + (() if kv_mask is None else (P(batch, None),))
    out = jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=q_spec,
                        check_vma=False)(*args)
    if not pad:
        return out
    return out[:, :, :lq] if head_major else out[:, :lq]


__all__ = ["sharded_local_attention"]
