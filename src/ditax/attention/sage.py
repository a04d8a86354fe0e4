"""8-bit attention (SageAttention's idea): int8 ``Q·Kᵀ``, float32 softmax, ``P·V`` in v's dtype.

Two backends over one quantization (:func:`prepare`) and one arithmetic:

- ``sage``: the Pallas kernel (:mod:`ditax.attention.kernels.sage_fwd`) — compiled on TPU
  (v5e / v6e run ``s8 × s8 → s32`` at twice their bf16 rate), Pallas interpret mode on CPU,
  refused on GPUs;
- ``sage_xla``: the XLA reference, every platform: a ``lax.scan`` over key blocks with an
  online softmax, so it holds ``O(Lq · block_kv)`` scores like ``blockwise``.

Under Ulysses the kernel also runs shard-major (:func:`sage_attention_shard_major`: q read and
the output written ``[U, B, N, Lc, K]`` as the leading-axis all-to-all moves them, like
flash's), bit-identical to the flat and chunked exchanges.

Quantization, per batch row and head:

1. K is smoothed: its mean over the (unmasked) tokens is subtracted. ``q·(k - μ) = q·k - q·μ``
   shifts every score of a query row by one constant, which the softmax ignores; it removes
   K's large per-channel offset, so int8 keeps its resolution for what varies between keys.
   Masked keys are zeroed (they never count and must not widen a block's scale).
2. Q and the smoothed K are quantized symmetrically to int8 per block of ``block_q`` /
   ``block_kv`` tokens (one scale ``max|x| / 127`` per block and head, over its tokens and
   head dim); tokens are padded to whole blocks (padded keys masked).
3. ``s = int32(q8 · k8ᵀ) · (scale_q · softmax_scale) · scale_k`` in float32, the online
   softmax in float32, ``P`` cast to v's dtype (bf16 in a bf16 model; float32 inputs keep
   float32) for ``P·V`` with float32 accumulation.

The log-sum-exp (``return_lse``, for a ring merge) is that of the true scores: the smoothing
shift ``softmax_scale · q·μ`` (float32, unquantized q) is added back, so ring steps whose K
chunks have different means merge correctly.

Gradient: none — this is an inference kernel. Differentiating through it raises
:class:`~ditax.errors.AttentionUnavailable` (a silent zero gradient through the rounding
would be wrong); train with ``flash``, ``splash``, ``blockwise`` or ``xla``.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from ditax.attention.blocks import check_shard_major
from ditax.attention.options import SageOptions
from ditax.attention.registry import BACKENDS
from ditax.errors import AttentionUnavailable
from ditax.intmath import ceil_div, round_up
from ditax.parallel.platform import platform_of

QMAX = 127.0
INT8_SUBLANE = 32      # TPU tiles int8 arrays (32, 128): blocks are multiples of 32
NO_GRADIENT = ("attention backend 'sage' / 'sage_xla' has no gradient (8-bit forward for "
               "inference); train with backend='flash', 'splash', 'blockwise' or 'xla'")


def _blocked(x, n: int, block: int):
    """``[U, B, N, l, K]`` → float32 ``[U, B, N, n, block, K]``, each shard zero-padded to
    ``n`` whole blocks."""
    U, B, N, l, K = x.shape
    x = jnp.pad(x, ((0, 0), (0, 0), (0, 0), (0, n * block - l), (0, 0)))
    return x.reshape(U, B, N, n, block, K).astype(jnp.float32)


def _scale(amax):
    """Symmetric int8 scale of a block from its max magnitude (1 for an all-zero block, so a
    valid key's scale is always > 0)."""
    return jnp.where(amax > 0, amax / QMAX, 1.0)


def _int8(x, scale):
    return jnp.clip(jnp.round(x / scale), -QMAX, QMAX).astype(jnp.int8)


def _block_extreme(k, keep, masked: bool, block: int, op, init):
    """Per block of ``block`` tokens and channel, the max (``op=lax.max``, ``init=-inf``) or
    min of the valid keys of k ``[U, B, N, l, K]`` (keep ``[U, B, 1, n, 1, block]``; only
    read when ``masked``: otherwise every key of the ``l`` is valid) as a
    strided ``reduce_window`` whose padding covers the partial last block: no padded copy of
    K (a pad before a blocked reduction was written out by XLA TPU in float32)."""
    l, n = k.shape[3], keep.shape[3]
    x = k
    if masked:      # (XLA TPU writes the selected K out for reduce_window: only with a mask)
        valid = jnp.swapaxes(keep, -1, -2).reshape(keep.shape[:3] + (-1, 1))[:, :, :, :l]
        x = jnp.where(valid, k, jnp.asarray(init, k.dtype))
    out = lax.reduce_window(x, jnp.asarray(init, k.dtype), op, (1, 1, 1, block, 1),
                            (1, 1, 1, block, 1),
                            ((0, 0), (0, 0), (0, 0), (0, n * block - l), (0, 0)))
    return out.astype(jnp.float32)


def prepare(q, k, keep, scale: float, bq: int, bkv: int, quant: tuple | None = None):
    """The quantization both backends share, on the shard-major layout (a plain head-major
    call is one shard): q ``[U, B, N, Lc, K]``, k ``[Uk, B, N, Lk_c, K]``, keep
    ``[B, Uk, Lk_c]`` bool or None. Each shard is padded to ``cdiv`` whole tiles of ``bq`` /
    ``bkv`` tokens and quantized in blocks of ``quant = (q's, k's)`` tokens (each dividing its
    tile; None: the tiles themselves), so shards of whole tiles give the blocks, means and
    scales of the un-sharded sequence.

    K's statistics come from one pass over K: per block and channel the sum, max and min
    of the valid keys. The mean ``μ`` is the sum of the block sums over the count; a block's
    scale is ``max_c max(max_t k - μ_c, μ_c - min_t k) / 127`` — exactly ``max |k - μ|``
    (float32 subtraction is monotone and rounds symmetrically), so the smoothed keys
    ``k - μ`` are formed only inside the int8 conversion and never written in float32.

    Returns ``(q8 [U, B, N, nq·bq, K], k8 [Uk, B, N, nk·bkv, K], q_rows [U, B, N, nq, 1, bq],
    k_rows [Uk, B, N, nk, 1, bkv], shift [U, B, N, Lc])``: per-token dequantization factors
    as lane rows (softmax scale folded into q's; 0 marks a masked or padded key) and the
    smoothing shift of the scores, ``scale · q·μ``."""
    U, B, N, Lc, K = q.shape
    Uk, Lkc = k.shape[0], k.shape[3]
    nq, nk = ceil_div(Lc, bq), ceil_div(Lkc, bkv)
    qq, qk = (bq, bkv) if quant is None else quant
    mq, mk = nq * bq // qq, nk * bkv // qk            # quantization blocks of the padded shard
    masked = keep is not None
    keep = jnp.ones((B, Uk, Lkc), bool) if keep is None else keep.astype(bool)
    keep = jnp.pad(keep, ((0, 0), (0, 0), (0, nk * bkv - Lkc)))
    keep = jnp.moveaxis(keep.reshape(B, Uk, mk, 1, qk), 1, 0)[:, :, None]   # [Uk,B,1,mk,1,qk]
    w = jnp.swapaxes(keep, -1, -2)                                           # [.., qk, 1]
    kb = _blocked(k, mk, qk)
    ksum = jnp.sum(jnp.where(w, kb, 0.0), axis=4)                            # [Uk,B,N,mk,K]
    kmax = _block_extreme(k, keep, masked, qk, lax.max, -jnp.inf)            # [Uk,B,N,mk,K]
    kmin = _block_extreme(k, keep, masked, qk, lax.min, jnp.inf)
    count = jnp.sum(keep, axis=(0, 3, 4, 5), dtype=jnp.float32)              # [B, 1]
    mu = jnp.sum(ksum, axis=(0, 3)) / jnp.maximum(count, 1.0)[..., None]     # [B, N, K]
    mu_b = mu[None, :, :, None]
    amax = jnp.maximum(jnp.max(jnp.maximum(kmax - mu_b, mu_b - kmin), axis=-1), 0.0)
    ks = _scale(amax)                                                        # [Uk,B,N,mk]
    k8 = jnp.where(w, _int8(kb - mu_b[..., None, :], ks[..., None, None]), 0)
    qb = _blocked(q, mq, qq)
    qs = _scale(jnp.max(jnp.abs(qb), axis=(4, 5)))                           # [U,B,N,mq]
    q8 = _int8(qb, qs[..., None, None])
    q_rows = jnp.broadcast_to((qs * scale)[..., None], (U, B, N, mq, qq))
    k_rows = jnp.where(keep, ks[..., None, None], 0.0)                       # [Uk,B,N,mk,1,qk]
    shift = scale * jnp.einsum("ubnlk,bnk->ubnl", q.astype(jnp.float32), mu)
    return (q8.reshape(U, B, N, nq * bq, K), k8.reshape(Uk, B, N, nk * bkv, K),
            q_rows.reshape(U, B, N, nq, 1, bq), k_rows.reshape(Uk, B, N, nk, 1, bkv), shift)


def xla_forward(q8, k8, v, q_rows, k_rows, *, block_kv: int):
    """The XLA twin of the kernel: a scan over key blocks, the same operations in the same
    order per tile. Returns ``(o [B, N, Lq_p, K] in v's dtype, lse [B, N, Lq_p])``."""
    B, N, Lq_p, K = q8.shape
    nk = k8.shape[2] // block_kv

    def blocks(x):      # [B, N, nk*bkv, ...] -> [nk, B, N, bkv, ...]
        return jnp.moveaxis(x.reshape(B, N, nk, block_kv, *x.shape[3:]), 2, 0)

    qs = q_rows[..., None]

    def step(carry, blk):
        m, l, acc = carry
        k_j, v_j, ks_j = blk
        s32 = lax.dot_general(q8, k_j, (((3,), (3,)), ((0, 1), (0, 1))),
                              precision=lax.Precision.DEFAULT, preferred_element_type=jnp.int32)
        ks = ks_j[:, :, None, :]
        s = s32.astype(jnp.float32) * qs * ks
        s = jnp.where(ks > 0.0, s, -jnp.inf)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1, keepdims=True))
        m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)
        p = jnp.exp(s - m_safe)
        alpha = jnp.exp(m - m_safe)
        l = alpha * l + jnp.sum(p, axis=-1, keepdims=True)
        pv = lax.dot_general(p.astype(v_j.dtype), v_j, (((3,), (2,)), ((0, 1), (0, 1))),
                             preferred_element_type=jnp.float32)
        return (m_new, l, alpha * acc + pv), None

    init = (jnp.full((B, N, Lq_p, 1), -jnp.inf, jnp.float32),
            jnp.zeros((B, N, Lq_p, 1), jnp.float32), jnp.zeros((B, N, Lq_p, K), jnp.float32))
    (m, l, acc), _ = lax.scan(step, init, (blocks(k8), blocks(v), blocks(k_rows)))
    empty = l == 0.0
    o = (acc / jnp.where(empty, 1.0, l)).astype(v.dtype)
    m_safe = jnp.where(m == -jnp.inf, 0.0, m)
    lse = jnp.where(empty, -jnp.inf, m_safe + jnp.log(jnp.where(empty, 1.0, l)))
    return o, lse[..., 0]


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7, 8, 9))
def _sage(q, k, v, keep, scale, bq, bkv, quant, interpret, kernel):
    """Shard-major 8-bit attention: q ``[U, B, N, Lc, K]``, k/v ``[Uk, B, N, Lk_c, K]``,
    keep ``[B, Uk, Lk_c]`` or None → ``(o [U, B, N, Lc, K] in q's dtype, lse
    [U, B, N, Lc])``. The XLA twin (``kernel=False``) takes one shard (``U = Uk = 1``)."""
    U, B, N, Lc, K = q.shape
    q8, k8, q_rows, k_rows, shift = prepare(q, k, keep, scale, bq, bkv, quant)
    if kernel:
        from ditax.attention.kernels.sage_fwd import sage_forward

        o, lse = sage_forward(q8, k8, v, q_rows, k_rows, out_len=Lc, block_q=bq,
                              block_kv=bkv, interpret=interpret)
    else:
        Lk_p = k8.shape[3]
        v_p = jnp.pad(v[0], ((0, 0), (0, 0), (0, Lk_p - v.shape[3]), (0, 0)))
        o, lse = xla_forward(q8[0], k8[0], v_p, q_rows[0].reshape(B, N, -1),
                             k_rows[0].reshape(B, N, -1), block_kv=bkv)
        o, lse = o[None, :, :, :Lc], lse[None]
    return o.astype(q.dtype), lse[..., :Lc] + shift


def _sage_fwd(q, k, v, keep, scale, bq, bkv, quant, interpret, kernel):
    return _sage(q, k, v, keep, scale, bq, bkv, quant, interpret, kernel), None


def _sage_bwd(*_):
    raise AttentionUnavailable(NO_GRADIENT)


_sage.defvjp(_sage_fwd, _sage_bwd)


def _blocks(block_q, block_kv, Lq: int, Lk: int, compiled: bool,
            quant_block: int = SageOptions.quant_block) -> tuple[int, int, tuple[int, int]]:
    """``(block_q, block_kv, (quant_q, quant_k))``: the tiles used (None: :func:`default_tiles`)
    and the int8 quantization blocks inside them — ``quant_block`` tokens, or the tile, or the
    length rounded up to 32 where smaller — each tile clipped to its length rounded up to its
    quantization block (and to 32 compiled: Mosaic's int8 tiles are (32, 128)). A given tile
    larger than ``quant_block`` must be a multiple of it."""
    if block_q is None or block_kv is None:
        dq, dkv = default_tiles(compiled)
        block_q, block_kv = block_q or dq, block_kv or dkv
    for name, b in (("block_q", block_q), ("block_kv", block_kv), ("quant_block", quant_block)):
        if not isinstance(b, int) or isinstance(b, bool) or b < 1:
            raise ValueError(f"sage: {name}={b!r} must be a positive int (e.g. 128)")
    tiles, quants = [], []
    for name, b, n in (("block_q", block_q, Lq), ("block_kv", block_kv, Lk)):
        if compiled and b % INT8_SUBLANE:
            raise ValueError(f"sage: {name}={b} is not a multiple of {INT8_SUBLANE} (TPU int8 "
                             f"tiles are (32, 128)); set attention.{name} to e.g. 128 or 512")
        check_quant_block(**{name: b}, quant_block=quant_block)
        quant = min(quant_block, b, round_up(max(n, 1), INT8_SUBLANE))
        step = math.lcm(quant, INT8_SUBLANE) if compiled else quant
        tiles.append(min(b, round_up(max(n, 1), step)))
        quants.append(quant)
    return tiles[0], tiles[1], (quants[0], quants[1])


def check_quant_block(block_q: int | None = None, block_kv: int | None = None,
                      quant_block: int = SageOptions.quant_block) -> None:
    """ValueError naming the tile that ``quant_block`` does not divide though smaller than
    it: the given tiles, or where one is unset every default tile (:func:`default_tiles`,
    compiled or not) — what a config can be checked against before any work."""
    for name, b in (("block_q", block_q), ("block_kv", block_kv)):
        given = b is not None
        for t in [b] if given else sorted(set(default_tiles(True) + default_tiles(False))):
            if quant_block < t and t % quant_block:
                raise ValueError(f"sage: {name}={t}{'' if given else ' (a default tile)'} is "
                                 f"not a multiple of attention.quant_block={quant_block}; set "
                                 f"{name} to a multiple of it, or quant_block to a divisor of "
                                 f"{t}")


def default_tiles(compiled: bool) -> tuple[int, int]:
    """sage's tiles where none is given: the chip's row compiled (the kernel's per-step cost
    makes 128-token tiles ~9x slower than 1024 on a v5e), 128 interpreted and in XLA."""
    from ditax.attention.tuning import SAGE_TILES

    return SAGE_TILES if compiled else (128, 128)


def _run(q, k, v, kv_mask, scale, blocks, return_lse, head_major, interpret, kernel):
    if not head_major:
        q, k, v = (jnp.swapaxes(x, 1, 2) for x in (q, k, v))
    scale = float(q.shape[-1] ** -0.5 if scale is None else scale)
    bq, bkv, quant = _blocks(*blocks[:2], q.shape[2], k.shape[2], kernel and not interpret,
                             blocks[2])
    keep = None if kv_mask is None else kv_mask[:, None, :]
    o, lse = _sage(q[None], k[None], v[None], keep, scale, bq, bkv, quant, bool(interpret),
                   kernel)
    o, lse = o[0], lse[0]
    if not head_major:
        o = jnp.swapaxes(o, 1, 2)
    return (o, lse) if return_lse else o


def sage_attention(q, k, v, *, kv_mask=None, scale=None, block_q: int | None = None,
                   block_kv: int | None = None, quant_block: int = SageOptions.quant_block,
                   interpret: bool | None = None, return_lse: bool = False,
                   head_major: bool = False):
    """8-bit attention through the Pallas kernel (backend ``sage``).

    q ``[B, Lq, N, K]``, k/v ``[B, Lk, N, K]`` (``head_major``: ``[B, N, L, K]``), kv_mask
    ``[B, Lk]`` bool (True = attend) → output in q's layout and dtype (and with
    ``return_lse`` the float32 log-sum-exp ``[B, N, Lq]``; rows with every key masked give
    zeros and -inf). ``interpret``: Pallas interpret mode; None = from the target platform
    (compiled on TPU, interpreted on CPU, refused on GPUs: use ``sage_xla`` there).
    """
    interpret = _kernel_interpret(interpret)
    return _run(q, k, v, kv_mask, scale, (block_q, block_kv, quant_block), return_lse,
                head_major, interpret, True)


def _kernel_interpret(interpret: bool | None) -> bool:
    """Whether the kernel runs interpreted (None: from the target platform), refusing a
    platform sage's kernel does not run on."""
    entry = BACKENDS["sage"]
    interpret = entry.default_interpret(platform_of()) if interpret is None else interpret
    why = entry.refusal(platform_of(), interpret=bool(interpret))
    if why is not None:
        raise AttentionUnavailable(why)
    return bool(interpret)


def check_shard_major_supported(block_q: int, block_kv: int, dtype, ring: int = 1,
                                platform=None, interpret: bool | None = None) -> list[str]:
    """Reasons the shard-major sage path cannot take these inputs (empty = it can), each
    naming the value and the fix (as :func:`ditax.attention.flash.check_shard_major_supported`
    for flash): the platform, the ring (no in-kernel merge: the lse merge of ring steps runs
    on the exchange path), compiled blocks that are no multiple of 32, the dtype."""
    entry = BACKENDS["sage"]
    platform = platform or platform_of()
    reasons = []
    why = entry.platform_reason(platform, interpret)
    if why is not None:
        reasons.append(why)
    if ring > 1:
        reasons.append(f"local='sage' with a ring of {ring}: the shard-major path has no ring "
                       f"merge for sage; use out_a2a='chunked' or 'flat'")
    compiled = not (entry.default_interpret(platform) if interpret is None else interpret)
    for name, b in (("block_q", block_q), ("block_kv", block_kv)):
        if compiled and b % INT8_SUBLANE:
            reasons.append(f"{name}={b} is not a multiple of {INT8_SUBLANE} (TPU int8 tiles); "
                           f"set {name} to a multiple of {INT8_SUBLANE}")
    if jnp.dtype(dtype).name not in entry.dtypes:
        reasons.append(f"dtype {jnp.dtype(dtype).name} is not supported by sage "
                       f"({', '.join(entry.dtypes)}); cast q/k/v")
    return reasons


def sage_blocks(block_q: int | None, block_kv: int | None, length: int,
                quant_block: int = SageOptions.quant_block) -> tuple[int, int]:
    """The tiles sage uses on ``length`` tokens (shard length under Ulysses): each clipped
    to the length rounded up to the quantization block (None: 128)."""
    return _blocks(block_q, block_kv, length, length, False, quant_block)[:2]


def sage_attention_shard_major(q, k, v, *, kv_keep=None, scale=None, block_q: int = 128,
                               block_kv: int = 128,
                               quant_block: int = SageOptions.quant_block,
                               return_lse: bool = False, interpret: bool | None = None,
                               whole_blocks: bool = True):
    """8-bit attention (the ``sage`` kernel) in the shard-major layout Ulysses uses, as
    :func:`ditax.attention.flash.flash_attention_shard_major`: q ``[U, B, N, Lc, K]``, k/v
    ``[Uk, B, N, Lk_c, K]`` (shard index leading), kv_keep ``[B, Uk, Lk_c]`` bool → output
    ``[U, B, N, Lc, K]`` in q's dtype (and lse ``[U, B, N, Lc]``), written shard-major.

    K's mean is over every shard's valid keys; each shard is quantized in ``cdiv`` blocks
    (a partial last block when ``whole_blocks=False``, its rows past the shard padded in the
    int8 copies and masked), so for shards of whole blocks the blocks, means and scales are
    those of the plain ``[B, N, U·Lc, K]`` call and the values equal it bit for bit."""
    check_shard_major("sage", q, k, v, block_q, block_kv, whole_blocks)
    Lc, K = q.shape[3], q.shape[4]
    interpret = _kernel_interpret(interpret)
    _blocks(block_q, block_kv, Lc, k.shape[3], not interpret, quant_block)  # the checks
    # the given tiles as they are (each shard in cdiv whole tiles), quantized inside them
    quant = (min(quant_block, block_q), min(quant_block, block_kv))
    scale = float(K ** -0.5 if scale is None else scale)
    o, lse = _sage(q, k, v, kv_keep, scale, block_q, block_kv, quant, bool(interpret), True)
    return (o, lse) if return_lse else o


def sage_xla_attention(q, k, v, *, kv_mask=None, scale=None, block_q: int | None = None,
                       block_kv: int | None = None,
                       quant_block: int = SageOptions.quant_block, return_lse: bool = False,
                       head_major: bool = False):
    """8-bit attention in plain XLA (backend ``sage_xla``; every platform): the same
    quantization and arithmetic as :func:`sage_attention`, a scan over ``block_kv`` keys
    (None: 128)."""
    return _run(q, k, v, kv_mask, scale, (block_q, block_kv, quant_block),
                return_lse, head_major, False, False)


__all__ = ["sage_attention", "sage_xla_attention", "sage_attention_shard_major",
           "check_shard_major_supported", "check_quant_block", "sage_blocks", "prepare",
           "xla_forward", "NO_GRADIENT"]
