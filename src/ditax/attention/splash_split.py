"""Splash at a padded key length without a mask: the whole key blocks at full speed, the last
block masked, the two merged exactly by their log-sum-exps.

Why: the wrapper pads the keys to a block multiple and masks the padded ones with segment
ids, and JAX's splash kernel applies segment ids (or any mask function) to every block, not
only to the partial ones. Measured on a TPU v5e at Wan 2.1 1.3B's 480p shape (12 heads x 128,
32,760 tokens padded to 32,768, blocks 2048 / 4096 / 1024): 0.0420 s masked against 0.0381 s
for the same length under ``FullMask``. Splitting the keys at ``P`` (``Lk`` rounded down to
``block_kv``) runs 7/8 of that work unmasked.

The split (keys ``[0, P)`` under ``FullMask``; keys ``[P, Lk)`` padded to a multiple of
``block_kv_compute`` and masked) gives two normalised partial outputs ``o1, o2`` with their
log-sum-exps ``lse1, lse2`` (the kernel's ``save_residuals`` mode); with ``m = max(lse1,
lse2)`` and ``wi = exp(lsei - m)``::

    o = (o1·w1 + o2·w2) / (w1 + w2),   lse = m + log(w1 + w2)

in float32: a convex combination, so neither part's rounding is amplified (both lse are
finite: each part holds at least one real key). The kernel's ``save_residuals`` mode has no
VJP, so the split is the primal of a ``custom_vjp`` whose rules run the masked kernel (and its
own VJP; :func:`ditax.attention.splash.masked_vjp`): gradients are those of the masked kernel,
and a training step pays for the masked forward as before. ``return_lse`` stays forward-only,
as the kernel's. The wrapper takes this path for pads past
:data:`ditax.attention.splash_duplicate.DUPLICATE_MAX` keys (or when asked:
``padded_keys="split"``); smaller pads run one kernel over copied keys instead.

Cost beyond the kernels (Wan 480p, bf16, compiled for a v5e deviceless, XLA's cycle
estimates at 1.5 GHz, head-major): the kernels write their lse lane-broadcast (``[N, L,
128]`` float32, 201 MB a part), sliced in one pass each (~0.6 ms each); the merge, per batch
row and cut before it, reads both parts in bf16 in one pass (~0.75 ms); the prefix's keys
and values are sliced out (~1.1 ms for both): ~0.94 ms more than the masked path's passes,
against the ~3.4 ms its unmasked prefix saves. (Merged outside the batch vmap and cut
afterwards, XLA wrote each part out as float32 first.)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ditax.attention.blocks import round_up
from ditax.attention.sequence.merge import merge_partials


def tail_length(Lk: int, P: int, block_kv_compute: int) -> int:
    """The keys the tail kernel sees: ``Lk - P`` padded to a multiple of the compute block
    (its one key block, which the compute block must divide)."""
    return round_up(Lk - P, block_kv_compute)


def split_forward(qt, kt, vt, *, Lk: int, P: int, cut: tuple[int, int], sizes,
                  interpret: bool):
    """Attention over head-major padded inputs (q ``[B, N, Lq_p, Kp]``, k/v ``[B, N, Lk_p,
    Kp]``, the keys past ``Lk`` ignored) split at key ``P``, cut to ``(Lq, K) = cut``:
    ``(o [B, N, Lq, K]`` in q's dtype, ``lse [B, N, Lq]`` float32)."""
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    from ditax.attention.splash_kernel import kernel as _kernel
    from ditax.attention.splash_kernel import kernel_precision

    B, N, Lq_p, _ = qt.shape
    bq, bkv, bkv_c = sizes.block_q, sizes.block_kv, sizes.block_kv_compute
    T = tail_length(Lk, P, bkv_c)
    head = _kernel(N, Lq_p, P, sa.BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=bkv_c),
                   interpret, True)
    tail = _kernel(N, Lq_p, T, sa.BlockSizes(block_q=bq, block_kv=T, block_kv_compute=bkv_c),
                   interpret, True)
    kv_seg = jnp.asarray(np.arange(T) < Lk - P, jnp.int32)
    Lq, K = cut

    def one(q, k, v):   # one batch row, merged cut (XLA then fuses the merge into one pass)
        o1, (lse1,) = head(q, k[:, :P], v[:, :P])
        o2, (lse2,) = tail(q, k[:, P:P + T], v[:, P:P + T],
                           segment_ids=sa.SegmentIds(q=jnp.ones((Lq_p,), jnp.int32),
                                                     kv=kv_seg))
        return merge(o1[:, :Lq, :K], lse1[:, :Lq], o2[:, :Lq, :K], lse2[:, :Lq])

    with jax.default_matmul_precision(kernel_precision(qt.dtype)):
        return jax.vmap(one)(qt, kt, vt)


def merge(o1, lse1, o2, lse2):
    """Two normalised partial attentions over disjoint keys (o ``[..., L, K]``, lse ``[...,
    L]``) → the attention over their union and its lse (:func:`~ditax.attention.sequence.
    merge.merge_partials` in float32); o in o1's dtype."""
    f32 = lambda x: x.astype(jnp.float32)  # noqa: E731
    o, lse = merge_partials(f32(o1), f32(lse1), f32(o2), f32(lse2))
    return o.astype(o1.dtype), lse


__all__ = ["split_forward", "tail_length", "merge"]
