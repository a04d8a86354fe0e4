"""VSA under Ulysses (``attention.sparsity=vsa attention.backend=ulysses attention.local=xla|
flash``): the whole of VSA per device, on its heads.

Everything VSA computes is per (sample, head): the tile means, the pooled attention, each
query tile's top-k picks and the fine pass over them. So after Ulysses' sequence→heads
exchange (q, k, v and the gate ``g_c`` ``[b, U·Lc, h, K]``, the key mask gathered) each
device runs :func:`~ditax.attention.sparse.vsa.vsa_attention` on the whole tile-major
sequence for its heads — the jnp path, flash over gathered tiles, or the table kernels — and
the heads→sequence exchange brings ``o = o_f + g_c · o_c`` back: the one-device values. The
tile-major length must split over the context shards (checked where the layout builds the
call); a ring (``ring`` / ``ulysses_ring``) is not done (refused in one line): a ring step
would need each query tile's picks among the visiting keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax

from ditax.parallel import collectives as col
from ditax.parallel.axes import check_batch_divides, check_heads_divide, head_shards


@dataclass(frozen=True)
class UlyssesVsa:
    """The self-attention call of a model under VSA with ``backend=ulysses``: ``vsa`` (a
    :class:`~ditax.attention.sparse.vsa.VsaCall` whose fine stage runs on one device) inside
    ``shard_map`` between the two Ulysses exchanges over ``mesh``'s context axis (module
    docstring). The :class:`~ditax.attention.AttentionCall` interface, token-major, with
    ``gate=``."""

    vsa: Any
    mesh: Any
    reads_head_major: bool = False
    gated: bool = True

    @property
    def backend(self) -> str:
        return "ulysses"

    def __call__(self, q, k, v, *, kv_mask=None, scale=None, head_major: bool = False,
                 gate=None):
        if head_major:
            raise ValueError("attention.sparsity=vsa runs token-major [B, L, N, K] only")
        grid = col.context_grid(self.mesh, 1, self.mesh.shape["context"])
        heads = q.shape[2] // head_shards(self.mesh)
        check_heads_divide(q.shape[2], self.mesh, "attention.sparsity=vsa")
        check_batch_divides(q.shape[0], self.mesh, "attention.sparsity=vsa: batch")
        if heads % self.mesh.shape["context"]:
            raise ValueError(f"attention.sparsity=vsa with backend=ulysses: {heads} heads per "
                             f"tensor shard are not divisible by the "
                             f"{self.mesh.shape['context']} context shards; use a "
                             f"mesh.context dividing {heads}")
        axis, tok = grid.ulysses_axis, grid.token_spec()
        extra = [(x, s) for x, s in ((gate, tok), (kv_mask, grid.mask_spec())) if x is not None]

        def body(q, k, v, *rest):
            rest = list(rest)
            g = col.seq_to_heads_flat(rest.pop(0), axis) if gate is not None else None
            m = rest.pop(0) if kv_mask is not None else None
            if m is not None:
                m = col.gather_keep(m, axis).reshape(m.shape[0], -1)
            q, k, v = (col.seq_to_heads_flat(x, axis) for x in (q, k, v))
            o = self.vsa(q, k, v, kv_mask=m, scale=scale, gate=g)
            return col.heads_to_seq_flat(o, axis)

        args = (q, k, v) + tuple(x for x, _ in extra)
        specs = (tok,) * 3 + tuple(s for _, s in extra)
        return jax.shard_map(body, mesh=grid.mesh, in_specs=specs, out_specs=tok,
                             check_vma=False)(*args)


__all__ = ["UlyssesVsa"]
