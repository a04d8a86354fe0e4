"""Small building blocks shared by the flash kernels, written the way Mosaic (TPU) lowers them.

- :func:`mxu_dot`: an MXU product in the operands' dtype with float32 accumulation and the
  precision pinned, so a kernel compiles the same whatever ``jax_default_matmul_precision``
  says: under "highest" Mosaic refuses bf16 operands ("Mosaic failed to compile TPU kernel:
  Bad lhs type", libtpu 0.0.42.1 / v6e). bf16 × bf16 products are exact in float32, so
  ``DEFAULT`` (one MXU pass) loses nothing there; float32 operands keep full float32 accuracy
  (``HIGHEST``), as their dtype asks.
- :func:`online_softmax_step` (:func:`online_softmax_steps`: several) /
  :func:`online_softmax_finish`: one key tile of the float32 online softmax on the VMEM
  scratch ``(m, l, acc)`` and the final ``o`` / log-sum-exp rows, shared by the flash, the
  8-bit (sage) and the VSA table forward kernels;
- :func:`captured_mosaic_modules`: the Mosaic modules Pallas lowers while it is active (to
  read a kernel's matmul types in tests and benchmarks);
- :func:`as_column`: per-row vectors (log-sum-exp, softmax delta, the
  key mask) travel as lane rows ``[..., n, 1, block]``. That is a free reshape of
  ``[..., n * block]``; its block's two minor dims ``(1, block)`` equal the array's, and Pallas
  TPU takes a block's last two dims only when they are multiples of (8, 128) or the whole
  axes, so it lowers for every block that is a multiple of 8; and it is compact in HBM, where
  a ``[..., L, 1]`` float32 column is tiled (8, 128), i.e. padded 128×. Kernels turn a row
  into the ``[block, 1]`` column they broadcast with :func:`as_column`.
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp

NT = (((1,), (1,)), ((), ()))   # A Bᵀ: contract both minor dims
NN = (((1,), (0,)), ((), ()))   # A B


def mxu_dot(a, b, dims):
    """``dot_general(a, b, dims)`` with float32 accumulation and a pinned precision.

    Operands of two dtypes (a ring's float32 carried output and its cotangent against bf16
    k / v) are both promoted first: Mosaic takes one operand dtype ("Bad rhs type", libtpu
    0.0.42.1 / v6e); the promotion is exact, so interpreted results do not change."""
    if a.dtype != b.dtype:
        dtype = jnp.promote_types(a.dtype, b.dtype)
        a, b = a.astype(dtype), b.astype(dtype)
    prec = jax.lax.Precision.HIGHEST if a.dtype == jnp.float32 else jax.lax.Precision.DEFAULT
    return jax.lax.dot_general(a, b, dims, precision=prec, preferred_element_type=jnp.float32)


def as_column(row_ref):
    """A ``[1, b]`` lane-row block (ref) as a ``[b, 1]`` column value."""
    return jnp.expand_dims(row_ref[0], -1)


NEG_INF = float("-inf")
LOG2E = 1.4426950408889634   # log2(e): exp(x) = exp2(x * LOG2E)
LN2 = 0.6931471805599453     # ln(2) = 1 / log2(e): log2 units back to natural ones


def online_softmax_step(s, v, m_sc, l_sc, acc_sc, scale: float = 1.0, *, log2: bool = False,
                        pv_f32: bool = False) -> None:
    """Fold one tile of float32 *unscaled* scores ``s [bq, bkv]`` (masked keys -inf) and
    values ``v [bkv, K]`` into the running max / sum / accumulator scratch (``P`` cast to v's
    dtype for the MXU).

    The softmax scale is folded into the exponent: the running max ``m`` is kept in score
    units and ``P = exp2((s - m) · scale·log2 e)``, one multiply per score where
    ``exp(s·scale - m')`` takes two (the explicit scale, and the exp's own change of base);
    on a TPU the per-score vector work, not the MXU, bounds this kernel (v5e: K = 128).
    ``log2``: the scores are in log2 units already (q was multiplied by ``scale·log2 e``),
    so ``P = exp2(s - m)`` with no multiply; ``pv_f32``: ``P`` enters the ``P v`` product as
    float32 (v promoted) at the MXU's default precision instead of cast to v's dtype.
    ``m_sc`` / ``l_sc`` are ``[bq, 1]`` columns or lane-replicated ``[bq, 128]`` tiles
    (:func:`widen`)."""
    online_softmax_steps([s], [v], m_sc, l_sc, acc_sc, scale, log2=log2, pv_f32=pv_f32)


def widen(x, n: int):
    """A per-row statistic ``x [b, w]`` (a ``[b, 1]`` column, or the same value in each of
    ``w`` lanes) as ``[b, n]``: ``x`` itself when it broadcasts (``w`` 1 or ``n``), else its
    lanes tiled (``n`` a multiple of ``w``), cut (``n < w``) or its first lane."""
    w = x.shape[1]
    if w in (1, n):
        return x
    if n % w == 0:
        return jnp.tile(x, (1, n // w))
    return x[:, :n] if n < w else x[:, :1]


def online_softmax_steps(ss, vs, m_sc, l_sc, acc_sc, scale: float = 1.0, *, log2: bool = False,
                         pv_f32: bool = False) -> None:
    """:func:`online_softmax_step` over several key tiles at once (scores ``ss[g]``, values
    ``vs[g]``): one running max over all of them, one rescale of ``l`` and ``acc``, then each
    tile's ``P`` and ``P v`` added in order (one tile: the same operations)."""
    c = 1.0 if log2 else scale * LOG2E
    m = m_sc[...]
    m_new = m
    for s in ss:
        m_new = jnp.maximum(m_new, jnp.max(s, axis=1, keepdims=True))
    m_safe = jnp.where(m_new == NEG_INF, 0.0, m_new)
    alpha = jnp.exp2(m - m_safe) if log2 else jnp.exp2((m - m_safe) * c)
    l, acc = alpha * l_sc[...], widen(alpha, acc_sc.shape[1]) * acc_sc[...]
    for s, v in zip(ss, vs):
        d = s - widen(m_safe, s.shape[1])
        p = jnp.exp2(d) if log2 else jnp.exp2(d * c)
        l = l + jnp.sum(p, axis=1, keepdims=True)
        if pv_f32:
            acc = acc + jax.lax.dot_general(p, v.astype(jnp.float32), NN,
                                            precision=jax.lax.Precision.DEFAULT,
                                            preferred_element_type=jnp.float32)
        else:
            acc = acc + mxu_dot(p.astype(v.dtype), v, NN)
    l_sc[...], acc_sc[...] = l, acc
    m_sc[...] = m_new


def online_softmax_start(m_sc, l_sc, acc_sc, scale: float = 1.0, lse_prev=None,
                         o_prev=None) -> None:
    """Empty running state, or the state of a normalised partial ``o_prev`` with log-sum-exp
    ``lse_prev [bq, 1]`` (natural log, scaled scores): ``m = lse_prev / scale`` (score units,
    as :func:`online_softmax_step` keeps it), ``l = 1``, ``acc = o_prev``; a row with no
    earlier visible key (lse_prev = -inf) starts empty."""
    if lse_prev is None:
        m_sc[...] = jnp.full(m_sc.shape, NEG_INF, jnp.float32)
        l_sc[...] = jnp.zeros(l_sc.shape, jnp.float32)
        acc_sc[...] = jnp.zeros(acc_sc.shape, jnp.float32)
        return
    seen = lse_prev > NEG_INF
    m_sc[...] = jnp.broadcast_to(jnp.where(seen, lse_prev / scale, NEG_INF), m_sc.shape)
    l_sc[...] = jnp.broadcast_to(jnp.where(seen, 1.0, 0.0), l_sc.shape)
    acc_sc[...] = jnp.where(seen, o_prev.astype(jnp.float32), 0.0)


def online_softmax_finish(o_ref, lse_ref, m_sc, l_sc, acc_sc, scale: float = 1.0) -> None:
    """Write the normalised output and the log-sum-exp lane row of the scaled scores
    (``m·scale + log l``; rows with every key masked: zeros and -inf). Lane-replicated
    statistics give their first lane."""
    m, l = m_sc[...][:, :1], l_sc[...][:, :1]
    empty = l == 0.0                             # every key of this row masked
    o_ref[...] = (acc_sc[...] / jnp.where(empty, 1.0, l)).astype(o_ref.dtype)
    m_safe = jnp.where(m == NEG_INF, 0.0, m)
    lse = jnp.where(empty, NEG_INF, m_safe * scale + jnp.log(jnp.where(empty, 1.0, l)))
    lse_ref[...] = lse.T                         # [bq, 1] column -> [1, bq] lane row


@contextlib.contextmanager
def captured_mosaic_modules():
    """Collect (as text) every Mosaic module Pallas lowers inside the ``with`` block — the
    kernel as Mosaic compiles it, e.g. its ``tpu.matmul`` operand types. Wraps Pallas' TPU
    lowering entry point (``lower_jaxpr_to_pipelined_module``, jax 0.10.2), restored after."""
    from jax._src.pallas.mosaic import pallas_call_registration as reg

    modules: list[str] = []
    lower = reg.lowering.lower_jaxpr_to_pipelined_module

    def capture(*a, **kw):
        module = lower(*a, **kw)
        modules.append(str(module))
        return module

    reg.lowering.lower_jaxpr_to_pipelined_module = capture
    try:
        yield modules
    finally:
        reg.lowering.lower_jaxpr_to_pipelined_module = lower
