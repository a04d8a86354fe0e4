"""``flash``: ditax's own Pallas flash attention (forward and backward kernels).

Two entry points over one kernel (:mod:`ditax.attention.kernels.flash_fwd`):

- :func:`flash_attention` — the BSHD local backend: q ``[B, Lq, N, K]``, k/v
  ``[B, Lk, N, K]``; any length works. With ``K`` a multiple of 128 (or one head) it reads
  ``[B, L, N·K]`` where the projections left it, each head a ``(block, K)`` column block,
  and masks partial last blocks instead of padding (:mod:`.kernels.flash_packed`: no
  relayout copies; bit-identical); otherwise it pads Lq/Lk to block multiples (padded keys
  masked, padded query rows dropped) and runs head-major.
- :func:`flash_attention_shard_major` — the layout Ulysses uses: q/k/v
  ``[U, B, N, Lc, K]`` (sequence shard leading, ``U * Lc`` tokens in shard-major order),
  output written in the same layout, so the Ulysses output exchange is one leading-axis
  ``all_to_all`` with no relayout. For ``Lc`` a block multiple it visits exactly the blocks
  of the plain layout and is bit-identical to :func:`flash_attention` on the un-sharded
  sequence (tested).

Numerics: scores, softmax statistics and accumulation in float32; output in q's dtype;
rows whose keys are all masked give zeros (lse = -inf).

Ring steps: both entry points take an optional previous partial ``(o_prev, lse_prev)`` over
other keys and continue the online softmax from it, so a ring merges inside the kernel (on
``[block_q, K]`` tiles, identical arithmetic whatever layout the caller keeps) rather than in
an elementwise jnp merge, whose compiled rounding on XLA CPU depends on the layout.

Gradient: ``jax.custom_vjp`` with Pallas backward kernels
(:mod:`ditax.attention.kernels.flash_bwd`, FlashAttention-2 style: a dq kernel over query
blocks and a dk/dv kernel over key blocks, each recomputing ``P = exp(S - lse)`` tile by tile,
inputs in their dtype into the MXU with float32 accumulation). It also takes the cotangent of
``lse`` so a ring merge can differentiate through it, and gives the cotangents of ``o_prev`` /
``lse_prev`` (elementwise, in jnp).

Platforms: the kernel is Mosaic-TPU code (VMEM scratch, a sequential key grid axis). It runs
compiled on TPU (lowering to Mosaic is tested; not yet run on a TPU), in Pallas interpret mode
on CPU (tests), and refuses on GPUs (use ``cudnn`` / ``te``). ``interpret=None`` decides from
the target platform (:func:`ditax.parallel.platform.platform_of`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from ditax.attention.blocks import SUBLANE, check_shard_major, effective_block, round_up
from ditax.attention.kernels.flash_bwd import flash_core_bwd
from ditax.attention.kernels.flash_fwd import Tune, flash_forward_shard_major
from ditax.attention.kernels.flash_variant import Variant
from ditax.attention.kernels.flash_packed import packable, packed_core
from ditax.attention.options import FlashOptions
from ditax.attention.registry import BACKENDS
from ditax.errors import AttentionUnavailable
from ditax.parallel.platform import platform_of

MAX_HEAD_DIM = 256


def default_interpret() -> bool:
    """Interpret mode unless the target platform compiles the kernel (TPU)."""
    return BACKENDS["flash"].default_interpret(platform_of())


def check_platform(interpret: bool) -> None:
    """Refuse a compiled (non-interpreted) flash kernel off TPU, naming the alternatives."""
    why = BACKENDS["flash"].refusal(platform_of(), interpret=interpret)
    if why is not None:
        raise AttentionUnavailable(why)


# ---------------------------------------------------------------- custom_vjp core


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8, 9, 10))
def _flash_core(q, k, v, keep, o_prev, lse_prev, scale, block_q, block_kv, interpret, tune):
    return flash_forward_shard_major(q, k, v, keep, o_prev, lse_prev, scale=scale,
                                     block_q=block_q, block_kv=block_kv, interpret=interpret,
                                     tune=tune)


def _core_fwd(q, k, v, keep, o_prev, lse_prev, scale, block_q, block_kv, interpret, tune):
    o, lse = _flash_core(q, k, v, keep, o_prev, lse_prev, scale, block_q, block_kv, interpret,
                         tune)
    return (o, lse), (q, k, v, keep, o_prev, lse_prev, o, lse)


_flash_core.defvjp(_core_fwd, flash_core_bwd)


# ---------------------------------------------------------------- public API


def check_shard_major_supported(head_dim: int, block_q: int, block_kv: int, dtype,
                                platform=None, interpret: bool | None = None) -> list[str]:
    """Reasons the shard-major kernel path cannot take these inputs (empty list = it can).

    ``platform``: the target (default :func:`~ditax.parallel.platform.platform_of`);
    ``interpret``: the resolved Pallas mode (None = the platform's default). Each reason
    names the value and the fix; Ulysses ``out_a2a="shard_major"`` raises with them,
    ``"chunked"`` falls back to the chunked exchange.
    """
    reasons = []
    why = BACKENDS["flash"].platform_reason(platform or platform_of(), interpret)
    if why is not None:
        reasons.append(why)
    if head_dim % SUBLANE or head_dim > MAX_HEAD_DIM:
        reasons.append(f"head dim K={head_dim} is not supported by the shard-major flash kernel "
                       f"(needs K % {SUBLANE} == 0 and K <= {MAX_HEAD_DIM}); use "
                       f"out_a2a='chunked' or 'flat'")
    for name, b in (("block_q", block_q), ("block_kv", block_kv)):
        if b % SUBLANE:
            reasons.append(f"{name}={b} is not a multiple of {SUBLANE} (TPU sublane tiling of "
                           f"the shard-major blocks); set {name} to a multiple of {SUBLANE}")
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16),
                                jnp.dtype(jnp.float16)):
        reasons.append(f"dtype {jnp.dtype(dtype).name} is not supported by the flash kernel "
                       f"(float32, bfloat16, float16); cast q/k/v")
    return reasons


def flash_attention_shard_major(q, k, v, *, kv_keep=None, scale=None, block_q: int = 128,
                                block_kv: int = 128, return_lse: bool = False, o_prev=None,
                                lse_prev=None, interpret: bool | None = None,
                                whole_blocks: bool = True, tune: Tune | None = None):
    """Flash attention in the shard-major layout (no padding here).

    Args:
      q: ``[U, B, N, Lc, K]`` — ``U`` sequence shards of ``Lc`` tokens, shard index leading
        (what a leading-axis all_to_all delivers in Ulysses).
      k, v: ``[Uk, B, N, Lk_c, K]``, the full key sequence in the same shard-major order.
      kv_keep: optional ``[B, Uk, Lk_c]`` bool (True = attend).
      block_q, block_kv: must divide ``Lc`` / ``Lk_c`` (the caller pads), unless
        ``whole_blocks=False``: then each shard's last block may be partial (read past the
        shard and masked, :mod:`.kernels.flash_fwd`) — the values of zero-padded shards of
        ``cdiv`` whole blocks, bit for bit, without the padded copies.
      tune: the kernels' compute block, backward blocks and VMEM limit
        (:class:`~ditax.attention.kernels.flash_fwd.Tune`; default: the table's for the
        target TPU, :func:`tuned`); its ``masked`` is set here from ``kv_keep``.
      o_prev, lse_prev: optional ``[U, B, N, Lc, K]`` / ``[U, B, N, Lc]`` partial result over
        other keys (normalised output and its log-sum-exp; an earlier ring step). The online
        softmax continues from it, so the result covers both key sets (the ring merge done
        inside the kernel); differentiable.
    Returns ``[U, B, N, Lc, K]`` in q's dtype, or o_prev's when given (and lse
    ``[U, B, N, Lc]`` float32).
    """
    check_shard_major("flash", q, k, v, block_q, block_kv, whole_blocks)
    U, B, N, Lc, K = q.shape
    scale = K ** -0.5 if scale is None else float(scale)
    interpret = default_interpret() if interpret is None else interpret
    check_platform(bool(interpret))
    if kv_keep is None:
        keep = jnp.ones((B, k.shape[0], k.shape[3]), jnp.int32)
    else:
        keep = kv_keep.astype(jnp.int32)
    tune = tuned(block_q, block_kv, K, q.dtype, interpret, tune)._replace(
        masked=kv_keep is not None)
    o_prev, lse_prev = _check_prev(o_prev, lse_prev, q.shape, q.shape[:-1])
    o, lse = _flash_core(q, k, v, keep, o_prev, lse_prev, scale, block_q, block_kv,
                         bool(interpret), tune)
    return (o, lse[..., 0]) if return_lse else o


def _check_prev(o_prev, lse_prev, o_shape, lse_shape):
    """Validate a previous partial; returns ``(o_prev, lse_prev[..., None] float32)`` or Nones."""
    if o_prev is None and lse_prev is None:
        return None, None
    if o_prev is None or lse_prev is None:
        raise ValueError("flash: pass o_prev and lse_prev together (a previous partial result "
                         "is its output and its log-sum-exp), or neither")
    if o_prev.shape != tuple(o_shape) or lse_prev.shape != tuple(lse_shape):
        raise ValueError(f"flash: o_prev{tuple(o_prev.shape)} / lse_prev{tuple(lse_prev.shape)} "
                         f"must have the shapes of the output {tuple(o_shape)} and of its lse "
                         f"{tuple(lse_shape)}")
    return o_prev, lse_prev.astype(jnp.float32)[..., None]


def tuned(block_q: int, block_kv: int, head_dim: int, dtype, interpret, tune=None,
          block_kv_compute=None, block_q_bwd=None, block_kv_bwd=None) -> Tune:
    """The :class:`Tune` of a call with forward blocks ``(block_q, block_kv)``: ``tune`` as
    given, else the compute block given or the table's (:mod:`ditax.attention.tuning`; none
    in interpret mode), backward blocks given or the table's (divisors of the forward
    blocks), and the VMEM limit both kernels need on the target TPU."""
    if tune is not None:
        return tune
    from ditax.attention import tuning

    kind = "" if interpret else platform_of().device_kind
    r = tuning.row("flash", kind)
    if block_kv_compute is None and kind:
        block_kv_compute = tuning.fit_block(block_kv, r.block_kv_compute, divides=block_kv)
    bq_b = block_q_bwd or (tuning.fit_block(block_q, r.block_q_bwd, SUBLANE, block_q)
                           if kind else None)
    bkv_b = block_kv_bwd or (tuning.fit_block(block_kv, r.block_kv_bwd, SUBLANE, block_kv)
                             if kind else None)
    for name, b, f in (("block_q_bwd", bq_b, block_q), ("block_kv_bwd", bkv_b, block_kv)):
        if b is not None and f % b:
            raise ValueError(f"flash: {name}={b} must divide the forward block {f}")
    item = jnp.dtype(dtype).itemsize
    limits = [tuning.vmem_limit(kind, block_q, block_kv, head_dim, block_kv_compute, item),
              tuning.vmem_limit(kind, bq_b or block_q, bkv_b or block_kv, head_dim, None,
                                item, backward=True)]
    limit = None if None in limits else max(limits)
    return Tune(True, block_kv_compute, limit, bq_b, bkv_b)


def _blocks(block_q, block_kv, Lq: int, Lk: int, interpret: bool) -> tuple[int, int]:
    """The forward blocks of a call: given ones as they are, unset ones the table's for the
    target TPU fitted to the lengths (:func:`ditax.attention.tuning.flash_blocks`), or 128 in
    interpret mode; then clipped to the lengths (:func:`effective_block`)."""
    if block_q is None or block_kv is None:
        from ditax.attention import tuning

        if interpret:
            block_q, block_kv = block_q or FlashOptions.DEFAULT, block_kv or FlashOptions.DEFAULT
        else:
            block_q, block_kv, _ = tuning.flash_blocks(Lq, Lk, platform_of().device_kind,
                                                       block_q, block_kv)
    return effective_block(block_q, Lq), effective_block(block_kv, Lk)


def flash_attention(q, k, v, *, kv_mask=None, scale=None, block_q: int | None = None,
                    block_kv: int | None = None, block_kv_compute: int | None = None,
                    block_q_bwd: int | None = None, block_kv_bwd: int | None = None,
                    return_lse: bool = False, o_prev=None, lse_prev=None,
                    interpret: bool | None = None, head_major: bool = False, block_table=None):
    """Flash attention, BSHD layout (or head-major ``[B, N, L, K]`` with ``head_major``).

    Args:
      q: ``[B, Lq, N, K]``; k, v: ``[B, Lk, N, K]``; kv_mask: ``[B, Lk]`` bool (True = attend).
      scale: softmax scale, default ``1/sqrt(K)``.
      block_q, block_kv: tile sizes (None: the table's for the target TPU,
        :mod:`ditax.attention.tuning`, fitted to the lengths; 128 in interpret mode); clipped
        to the length rounded up to 8 (:func:`effective_block`), and the lengths are padded
        to block multiples (padded keys masked, padded queries dropped), so the result
        equals unpadded attention.
      block_kv_compute: keys per inner step of the forward (divides block_kv; None: the
        table's). block_q_bwd / block_kv_bwd: the backward's tiles (divide the forward
        ones; None: the table's, or the forward ones in interpret mode).
      return_lse: also return the log-sum-exp ``[B, N, Lq]`` float32 (for ring merges).
      o_prev, lse_prev: optional ``[B, Lq, N, K]`` / ``[B, N, Lq]`` partial result over other
        keys to continue from (see :func:`flash_attention_shard_major`).
      interpret: Pallas interpret mode; None = from the target platform (compiled on TPU,
        interpreted on CPU, refused on GPU).
      head_major: q ``[B, N, Lq, K]``, k/v ``[B, N, Lk, K]`` (o_prev likewise) and the
        output head-major, as a model's projections can write them: the kernel reads them
        in place, partial last blocks masked instead of padded (no copies; the values of
        the padded head-major call, bit for bit).
      block_table: a :class:`~ditax.attention.sparse.masks.BlockTable` (tokens tile-major):
        the kernels visit only its live blocks (:mod:`.kernels.flash_sparse`; blocks inside
        one tile); None: dense.
    Returns ``[B, Lq, N, K]`` in q's dtype, or o_prev's when given (and lse).
    """
    interpret = default_interpret() if interpret is None else bool(interpret)
    check_platform(interpret)
    bq, bkv, tune = flash_tune(q, k, block_q=block_q, block_kv=block_kv,
                               block_kv_compute=block_kv_compute, block_q_bwd=block_q_bwd,
                               block_kv_bwd=block_kv_bwd, interpret=interpret,
                               head_major=head_major)
    return flash_attention_tuned(q, k, v, tune._replace(table=block_table), block_q=bq,
                                 block_kv=bkv, kv_mask=kv_mask, scale=scale,
                                 return_lse=return_lse, o_prev=o_prev, lse_prev=lse_prev,
                                 interpret=interpret, head_major=head_major)


def flash_tune(q, k, *, block_q=None, block_kv=None, block_kv_compute=None, block_q_bwd=None,
               block_kv_bwd=None, interpret: bool = False, head_major: bool = False
               ) -> tuple[int, int, Tune]:
    """``(block_q, block_kv, tune)`` of a :func:`flash_attention` call on q / k (same
    arguments): the forward blocks (:func:`_blocks`) and the kernels' :class:`Tune`
    (:func:`tuned`), to pass to :func:`flash_attention_tuned`, e.g. with another
    ``tune.variant``."""
    t = 2 if head_major else 1
    Lq, Lk, K = q.shape[t], k.shape[t], q.shape[3]
    bq, bkv = _blocks(block_q, block_kv, Lq, Lk, interpret)
    tune = tuned(bq, bkv, K, q.dtype, interpret, None, block_kv_compute and min(
        block_kv_compute, bkv), block_q_bwd, block_kv_bwd)
    return bq, bkv, tune


def flash_attention_tuned(q, k, v, tune: Tune, *, block_q: int, block_kv: int, kv_mask=None,
                          scale=None, return_lse: bool = False, o_prev=None, lse_prev=None,
                          interpret: bool = False, head_major: bool = False):
    """:func:`flash_attention` with its blocks and the kernels' ``tune`` resolved
    (:func:`flash_tune`): ``tune.table`` is the block table, ``tune.variant`` the forward's
    block-loop variant (:mod:`.kernels.flash_variant`: benchmarks and tests pick one; not a
    config option). Same arguments and result otherwise; ``interpret`` resolved (a bool)."""
    bq, bkv, block_table = block_q, block_kv, tune.table
    if head_major:
        return _flash_head_major(q, k, v, kv_mask, scale, bq, bkv, return_lse,
                                 o_prev, lse_prev, interpret, tune)
    B, Lq, N, K = q.shape
    Lk = k.shape[1]
    Lq_p, Lk_p = round_up(Lq, bq), round_up(Lk, bkv)
    if packable(N, K) and block_table is None:
        return _flash_packed(q, k, v, kv_mask, scale, bq, bkv, return_lse, o_prev, lse_prev,
                             interpret, tune)
    if Lk_p != Lk and kv_mask is None:
        kv_mask = jnp.ones((B, Lk), bool)
    _check_prev(o_prev, lse_prev, q.shape, (B, N, Lq))
    if Lq_p != Lq:
        q = jnp.pad(q, ((0, 0), (0, Lq_p - Lq), (0, 0), (0, 0)))
        if o_prev is not None:
            o_prev = jnp.pad(o_prev, ((0, 0), (0, Lq_p - Lq), (0, 0), (0, 0)))
            lse_prev = jnp.pad(lse_prev, ((0, 0), (0, 0), (0, Lq_p - Lq)),
                               constant_values=-jnp.inf)
    if Lk_p != Lk:
        pad = ((0, 0), (0, Lk_p - Lk), (0, 0), (0, 0))
        k, v = jnp.pad(k, pad), jnp.pad(v, pad)
        kv_mask = jnp.pad(kv_mask, ((0, 0), (0, Lk_p - Lk)))

    def to5(x):  # [B, L, N, K] -> [1, B, N, L, K]
        return jnp.swapaxes(x, 1, 2)[None]

    keep = None if kv_mask is None else kv_mask[:, None, :]
    scale = K ** -0.5 if scale is None else float(scale)
    tune = tune._replace(masked=keep is not None)
    keep = jnp.ones((B, 1, Lk_p), jnp.int32) if keep is None else keep.astype(jnp.int32)
    prev = (None, None)
    if o_prev is not None:
        prev = (to5(o_prev), lse_prev.astype(jnp.float32)[None, ..., None])
    o, lse = _flash_core(to5(q), to5(k), to5(v), keep, *prev, scale, bq, bkv, interpret, tune)
    o = jnp.swapaxes(o[0], 1, 2)[:, :Lq]
    if return_lse:
        return o, lse[0, ..., 0][:, :, :Lq]
    return o


def _flash_head_major(q, k, v, kv_mask, scale, bq, bkv, return_lse, o_prev, lse_prev,
                      interpret, tune):
    """:func:`flash_attention` on head-major ``[B, N, L, K]``: the shard-major kernel with one
    shard (a free leading axis), partial last blocks."""
    lead = (lambda x: None if x is None else x[None])   # noqa: E731
    o, lse = flash_attention_shard_major(
        q[None], k[None], v[None], kv_keep=None if kv_mask is None else kv_mask[:, None, :],
        scale=scale, block_q=bq, block_kv=bkv, return_lse=True, o_prev=lead(o_prev),
        lse_prev=lead(lse_prev), interpret=interpret, whole_blocks=False, tune=tune)
    return (o[0], lse[0]) if return_lse else o[0]


def _flash_packed(q, k, v, kv_mask, scale, bq, bkv, return_lse, o_prev, lse_prev, interpret,
                  tune):
    """:func:`flash_attention` through the packed-layout kernel (:mod:`.kernels.flash_packed`):
    ``[B, L, N, K]`` is read as ``[B, L, N·K]`` (the projections' own layout), no padding."""
    B, Lq, N, K = q.shape
    Lk = k.shape[1]
    _check_prev(o_prev, lse_prev, q.shape, (B, N, Lq))
    scale = K ** -0.5 if scale is None else float(scale)
    nq, Lk_p = -(-Lq // bq), round_up(Lk, bkv)
    tune = tune._replace(masked=kv_mask is not None)
    keep = jnp.arange(Lk_p)[None, :] < Lk
    if kv_mask is not None:
        keep = jnp.pad(kv_mask.astype(bool), ((0, 0), (0, Lk_p - Lk)))
    keep = jnp.broadcast_to(keep, (B, Lk_p)).astype(jnp.int32)
    prev = (None, None)
    if o_prev is not None:
        lp = jnp.pad(lse_prev.astype(jnp.float32), ((0, 0), (0, 0), (0, nq * bq - Lq)),
                     constant_values=-jnp.inf)
        prev = (o_prev.reshape(1, B, Lq, N * K), lp.reshape(1, B, N, nq, 1, bq))
    o, lse = packed_core(q.reshape(1, B, Lq, N * K), k.reshape(1, B, Lk, N * K),
                          v.reshape(1, B, Lk, N * K), keep, *prev, N, scale, bq, bkv,
                          bool(interpret), tune)
    o = o.reshape(B, Lq, N, K)
    if return_lse:
        return o, lse.reshape(B, N, nq * bq)[:, :, :Lq]
    return o


__all__ = ["flash_attention", "flash_attention_shard_major", "flash_tune",
           "flash_attention_tuned", "Variant", "packable", "effective_block",
           "check_shard_major_supported", "default_interpret", "check_platform"]
