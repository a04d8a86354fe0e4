"""``ring``: ring attention over the ``context`` mesh axis.

Each device keeps its query shard; K/V (and their mask chunk) move one device along the ring
per step with ``jax.lax.ppermute``; each step runs the local kernel with ``return_lse`` and
the partials merge by log-sum-exp (online softmax, float32). Gradients: autodiff through the
``lax.scan`` of steps (``ppermute`` transposes to the reverse rotation); the flash kernel's
custom VJP takes the lse cotangent.

``out_a2a`` exists for the Ulysses exchange, which pure ring does not have: only ``"flat"``
(the default) is accepted, anything else raises rather than being ignored.
Lengths that do not divide the context size are padded (padded keys masked). Cross-attention
(``Lk != Lq``) runs without rotation: queries sharded, text K/V replicated.
"""

from __future__ import annotations

from ditax.attention.context_parallel import (
    OUT_A2A_MODES,
    check_out_a2a,
    context_size,
    merge_partials,
    sequence_parallel_attention,
)


def ring_attention(q, k, v, *, mesh=None, kv_mask=None, scale=None, local: str = "xla",
                   out_a2a: str = "flat", block_q: int = 128, block_kv: int = 128,
                   interpret: bool | None = None):
    """q/k/v ``[B, L, N, K]`` (sequence sharded over ``context``) → ``[B, L, N, K]``.

    ``local``: a kernel that returns lse (flash, blockwise, reference) or ``xla`` (lse then
    computed beside it in jnp).
    """
    check_out_a2a(out_a2a)
    if out_a2a != "flat":
        raise ValueError(f"ring: out_a2a={out_a2a!r} has no meaning for pure ring attention (K/V "
                         f"rotate, there is no Ulysses all-to-all to lay out); use out_a2a='flat', "
                         f"or backend='ulysses'/'ulysses_ring' for the {OUT_A2A_MODES[1:]} modes")
    C = context_size(mesh)
    if k.shape[1] != q.shape[1]:
        from ditax.attention.ulysses import _cross

        return _cross(q, k, v, mesh, kv_mask, scale, local, out_a2a, block_q, block_kv,
                      interpret, "ring")
    return sequence_parallel_attention(q, k, v, mesh=mesh, kv_mask=kv_mask, scale=scale, ring=C,
                                       ulysses=1, local=local, out_a2a="flat", block_q=block_q,
                                       block_kv=block_kv, interpret=interpret, backend="ring")


__all__ = ["ring_attention", "merge_partials"]
