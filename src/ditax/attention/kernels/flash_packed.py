"""The flash forward kernel over the *packed* token layout ``[B, L, N·K]`` (heads side by side
in the lanes), with no padding of the sequence.

Why: a model's projections produce ``[B, L, D]`` with ``D = N·K``, tiled (8, 128) over
``(L, D)`` on TPU. Viewing it as ``[B, L, N, K]`` and transposing to the head-major
``[B, N, L, K]`` the other flash entry points read are two relayout copies of every
activation (and one pad to a block multiple), and the output needs two more on the way back
(measured at Wan 14B 720p on v6e: four 92 MiB copies per cross-attention). Here one head's
tile is the ``(block, K)`` block at column ``h`` of the packed array, so the kernel reads q /
k / v and writes o where they are (``K`` a multiple of 128, or one head, as Pallas TPU wants
a block's minor dim).

Lengths need not be block multiples: the grid runs ``cdiv(L, block)`` blocks; the last one
reads past the array (unspecified values) and writes only its valid rows. Keys past ``Lk``
(and masked keys) are masked through ``keep``, which is padded to whole blocks (a small int32
row), and their value rows are zeroed in the kernel, so each valid row sees exactly the
tiles the zero-padded head-major call sees: the results are bit-identical to it.

Same kernel body as :mod:`.flash_fwd`; lse leaves as lane rows ``[U, B, N, nq, 1, block_q]``
(rows past a shard's length are unspecified: callers slice or mask them). The arrays carry a
leading shard axis ``U`` like the shard-major kernel's (``U = 1`` for the BSHD call).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from ditax.attention.kernels.flash_bwd import flash_core_bwd
from ditax.attention.kernels.flash_fwd import Tune, _kernel, compute_block, mask_kind, run_forward
from ditax.intmath import ceil_div


def packable(num_heads: int, head_dim: int) -> bool:
    """Whether a head's ``(block, K)`` tile of ``[B, L, N·K]`` is a block Pallas TPU takes:
    ``K`` a multiple of the 128 lanes, or the whole minor axis (one head)."""
    return head_dim % 128 == 0 or num_heads == 1


def flash_forward_packed(q, k, v, keep, o_prev=None, lse_prev=None, *, heads: int,
                         scale: float, block_q: int, block_kv: int, interpret: bool,
                         tune: Tune = Tune()):
    """q ``[U, B, Lc, N·K]``, k/v ``[Uk, B, Lk_c, N·K]`` (``U`` sequence shards of ``Lc``
    tokens, shard index leading: what a leading-axis all_to_all delivers in Ulysses; the
    plain case has ``U = Uk = 1``), keep ``[B, Uk·nkv·block_kv]`` int32 (1 = attend; each
    shard's keys padded with 0 to ``nkv = cdiv(Lk_c, block_kv)`` whole blocks), optional
    o_prev ``[U, B, Lc, N·K]`` / lse_prev rows ``[U, B, N, nq, 1, block_q]`` float32 (a
    partial over other keys to continue from). Keys and queries are walked shard-major, each
    shard in ``cdiv`` blocks, so a shard's last block is partial.

    Returns ``(o [U, B, Lc, N·K] in q's (or o_prev's) dtype, lse rows [U, B, N, nq, 1,
    block_q] float32)`` with ``nq = cdiv(Lc, block_q)``.
    """
    U, B, Lc, D = q.shape
    Uk, Lkc = k.shape[0], k.shape[2]
    K = D // heads
    nq, nkv = ceil_div(Lc, block_q), ceil_div(Lkc, block_kv)
    if keep.shape != (B, Uk * nkv * block_kv):
        raise ValueError(f"packed flash: keep must be [B, {Uk * nkv * block_kv}] (each shard's "
                         f"keys padded to whole blocks of {block_kv}); got {tuple(keep.shape)}")
    has_prev = o_prev is not None
    rows = (U, B, heads, nq, 1, block_q)
    div, rem = jax.lax.div, jax.lax.rem

    def q_map(b, h, i, j):
        return div(i, nq), b, rem(i, nq), h

    def kv_map(b, h, i, j):
        return div(j, nkv), b, rem(j, nkv), h

    def lse_map(b, h, i, j):
        return div(i, nq), b, h, rem(i, nq), 0, 0

    q_spec = pl.BlockSpec((None, None, block_q, K), q_map)
    kv_spec = pl.BlockSpec((None, None, block_kv, K), kv_map)
    keep_spec = pl.BlockSpec((None, None, 1, block_kv), lambda b, h, i, j: (b, j, 0, 0))
    lse_spec = pl.BlockSpec((None, None, None, None, 1, block_q), lse_map)
    in_specs = [q_spec, kv_spec, kv_spec, keep_spec] + ([q_spec, lse_spec] if has_prev else [])
    args = (q, k, v, keep.reshape(B, Uk * nkv, 1, block_kv))
    if has_prev:
        args += (o_prev, lse_prev.astype(jnp.float32))
    partial = Lkc % block_kv != 0
    kernel = functools.partial(_kernel, scale=float(scale), has_prev=has_prev,
                               mask=mask_kind(tune.masked, partial), partial=partial, nkv=nkv,
                               block_kv_compute=compute_block(block_kv, tune.block_kv_compute),
                               variant=tune.variant)
    o, lse = run_forward(kernel, (B, heads, U * nq, Uk * nkv), in_specs, q_spec, lse_spec, args,
                         jax.ShapeDtypeStruct(q.shape, o_prev.dtype if has_prev else q.dtype),
                         rows, block_q, K, interpret=interpret, name="ditax_flash_fwd_packed",
                         tune=tune)
    return o, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8, 9, 10, 11))
def packed_core(q, k, v, keep, o_prev, lse_prev, heads, scale, block_q, block_kv, interpret,
                tune):
    return flash_forward_packed(q, k, v, keep, o_prev, lse_prev, heads=heads, scale=scale,
                                block_q=block_q, block_kv=block_kv, interpret=interpret,
                                tune=tune)


def _packed_fwd(q, k, v, keep, o_prev, lse_prev, heads, scale, block_q, block_kv, interpret,
                tune):
    o, lse = packed_core(q, k, v, keep, o_prev, lse_prev, heads, scale, block_q, block_kv,
                          interpret, tune)
    return (o, lse), (q, k, v, keep, o_prev, lse_prev, o, lse)


def _packed_bwd(heads, scale, block_q, block_kv, interpret, tune, res, cts):
    """The backward of the packed forward through the shard-major backward kernels
    (:func:`flash_core_bwd`): every shard padded to whole blocks and made head-major (zero
    rows; lse rows past a shard's ``Lc`` set to -inf so they contribute exact zeros, as the
    zero-padded rows of the head-major forward do), gradients sliced back."""
    q, k, v, keep, o_prev, lse_prev, o, lse = res
    do, dlse = cts
    U, B, Lc, D = q.shape
    Uk, Lkc, K = k.shape[0], k.shape[2], D // heads
    Lq_p, Lk_p = lse.shape[3] * block_q, keep.shape[1] // Uk
    valid = (jnp.arange(Lq_p) < Lc)[None, None, None, :]

    def to5(x, n):      # [U, B, l, N*K] -> [U, B, N, n, K]
        x = jnp.pad(x, ((0, 0), (0, 0), (0, n - x.shape[2]), (0, 0)))
        return jnp.transpose(x.reshape(x.shape[:3] + (heads, K)), (0, 1, 3, 2, 4))

    def from5(x, n):    # [U, B, N, n', K] -> [U, B, n, N*K]
        x = jnp.transpose(x, (0, 1, 3, 2, 4))[:, :, :n]
        return x.reshape(x.shape[:3] + (D,))

    def rows5(x, fill):
        return jnp.where(valid, x.reshape(U, B, heads, Lq_p), fill)[..., None]

    prev = (None, None)
    if o_prev is not None:
        prev = (to5(o_prev, Lq_p), rows5(lse_prev, -jnp.inf))
    res5 = (to5(q, Lq_p), to5(k, Lk_p), to5(v, Lk_p), keep.reshape(B, Uk, Lk_p), *prev,
            to5(o, Lq_p), rows5(lse, -jnp.inf))
    tune = tune._replace(masked=tune.masked or Lk_p != Lkc)   # zero-padded keys: masked
    dq, dk, dv, _, d_op, d_lp = flash_core_bwd(scale, block_q, block_kv, interpret, tune, res5,
                                               (to5(do, Lq_p), rows5(dlse, 0.0)))
    if o_prev is not None:
        d_op, d_lp = from5(d_op, Lc), d_lp[..., 0].reshape(lse_prev.shape)
    return from5(dq, Lc), from5(dk, Lkc), from5(dv, Lkc), None, d_op, d_lp


packed_core.defvjp(_packed_fwd, _packed_bwd)
