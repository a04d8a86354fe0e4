"""An attention projection in one pass: ``x @ W + b`` written head-major, with its RMSNorm
across heads, RoPE and the softmax scale applied before the result leaves VMEM (Pallas, TPU).

What it replaces, per projection of a Wan layer (:class:`~ditax.models.wan.attention.
WanAttention` in the head-major layout): XLA's dot with the norm's statistics (one fusion),
then a second fusion that reads the projection back to scale it, rotate it (RoPE) and, for
the query, multiply it by the softmax scale, and writes it again. At Wan 2.1 1.3B 480x832x81
on a v5e those were 30.8 ms (q, k: ~150 TFLOP/s, 76 % of the MXU) plus 13.5 ms (RoPE) each a
forward, and 9.3 ms for the cross-attention query's norm pass (``docs/tpu_v5e.md``, session
63's profile). Here one kernel per projection reads a block of token rows, runs the
``[rows, D] x [D, K]`` product for each head (the kernel is read as stored, ``[N, D, K]``,
:class:`~ditax.nn.Linear` ``out_heads``), keeps the rows of every head in VMEM until their
norm statistics are known, then scales, rotates and writes them.

Same values as the XLA path (:func:`reference`), rounded at the same points: the product
and the bias in ``x.dtype``, the norm in float32 rounded once, RoPE in float32 rounded
once, the softmax scale in float32 rounded once (the attention kernel's own pass). Only the
order of the products' and the norm's float32 sums differs.

Measured on a v5e in the 480x832x81 forward (session 64, ``docs/tpu_v5e.md``): the q, k and
cross-attention q kernels 28.2, 27.7 and 25.6 ms a forward (~164 TFLOP/s for q) where XLA's
projections with their norm statistics, RoPE and the query's norm pass took 128.8 ms. A
software-pipelined variant (block ``j``'s products beside block ``j - 1``'s epilogue in one
basic block, float32 kept from the accumulator in a double-buffered scratch) ran slower:
30.9 ms for q and k.

The backward is the reference's (``jax.vjp`` of :func:`reference`, recomputed): the kernel
is a forward speed-up; a training step differentiates the same function.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from ditax.nn.rope import apply_rope

LANES = 128
#: token rows a grid step; fewer where the length is shorter (a multiple of 8)
ROWS = 512
VMEM_LIMIT = 96 * 2**20


@dataclass(frozen=True)
class HeadProjection:
    """What one projection applies after its product (static: part of the program).

    ``norm``: RMSNorm across all ``N·K`` channels of a token (``eps``); ``rope``: the
    rotary tables are passed; ``scale``: multiplied last (the softmax scale of a query;
    1.0: none); ``rows``: token rows a grid step (None: :data:`ROWS`)."""

    norm: bool = False
    eps: float = 1e-6
    rope: bool = False
    scale: float = 1.0
    rows: Optional[int] = None


def rms_across_heads(y, weight, eps: float):
    """Wan's RMSNorm across heads on head-major ``y [B, N, L, K]``: the RMS over all ``N·K``
    channels of a token in float32, times ``weight [N·K]`` viewed ``[N, 1, K]``, in
    ``y.dtype`` (what the kernel's epilogue computes)."""
    n, k = y.shape[1], y.shape[3]
    yf = y.astype(jnp.float32)
    r = jax.lax.rsqrt(jnp.mean(yf * yf, axis=(1, 3), keepdims=True) + eps)
    return (yf * r * weight.astype(jnp.float32).reshape(n, 1, k)).astype(y.dtype)


def reference(x, w, b, nw, cos, sin, spec: HeadProjection):
    """The XLA path, step by step: ``x [B, L, D]``, ``w [N, D, K]``, ``b [N·K]`` (or None),
    ``nw [N·K]`` the norm's weight (or None), ``cos`` / ``sin`` ``[L, K]`` float32 (or None)
    → ``[B, N, L, K]`` in ``x.dtype``."""
    n, _, k = w.shape
    y = jnp.einsum("bli,nik->bnlk", x, w.astype(x.dtype))
    if b is not None:
        y = y + b.astype(x.dtype).reshape(n, 1, k)
    if spec.norm:
        y = rms_across_heads(y, nw, spec.eps)
    if spec.rope:
        y = apply_rope(y, cos, sin, head_major=True)
    if spec.scale != 1.0:
        y = (y.astype(jnp.float32) * spec.scale).astype(x.dtype)
    return y


def _partner(y):
    """Each channel's signed RoPE partner within a head's ``K`` lanes: ``−y[2i+1]`` at
    ``2i``, ``y[2i]`` at ``2i+1`` (two lane rolls, as :func:`jnp.roll` turns)."""
    k = y.shape[-1]
    even = jax.lax.broadcasted_iota(jnp.int32, y.shape, y.ndim - 1) % 2 == 0
    return jnp.where(even, -pltpu.roll(y, k - 1, y.ndim - 1), pltpu.roll(y, 1, y.ndim - 1))


def _kernel(spec: HeadProjection, n: int, k: int, has_bias: bool, *refs):
    refs = list(refs)
    x_ref, w_ref = refs.pop(0), refs.pop(0)
    b_ref = refs.pop(0) if has_bias else None
    nw_ref = refs.pop(0) if spec.norm else None
    cos_ref, sin_ref = (refs.pop(0), refs.pop(0)) if spec.rope else (None, None)
    o_ref, y_scr = refs
    dt = o_ref.dtype
    x = x_ref[0]                                               # [rows, D]
    ss = jnp.zeros((x.shape[0], 1), jnp.float32)
    for h in range(n):
        y = jax.lax.dot_general(x, w_ref[h], (((1,), (0,)), ((), ())),
                                preferred_element_type=jnp.float32).astype(dt)
        if has_bias:
            y = (y.astype(jnp.float32) + b_ref[pl.ds(h, 1), :].astype(dt).astype(
                jnp.float32)).astype(dt)
        if spec.norm:
            yf = y.astype(jnp.float32)
            ss = ss + jnp.sum(yf * yf, axis=1, keepdims=True)
        y_scr[h] = y
    r = jax.lax.rsqrt(ss * (1.0 / (n * k)) + spec.eps) if spec.norm else None
    for h in range(n):
        y = y_scr[h].astype(jnp.float32)
        if spec.norm:
            y = (y * r * nw_ref[pl.ds(h, 1), :].astype(jnp.float32)).astype(dt).astype(
                jnp.float32)
        if spec.rope:
            y = (y * cos_ref[...] + _partner(y) * sin_ref[...]).astype(dt).astype(jnp.float32)
        if spec.scale != 1.0:
            y = y * spec.scale
        o_ref[0, h] = y.astype(dt)


def rows_for(length: int, rows: Optional[int] = None) -> int:
    """Token rows a grid step: ``rows`` (a multiple of 8) clipped to the length rounded up to
    8; by default the largest multiple of 16 (bf16's sublane tile) up to :data:`ROWS` that
    divides the length, when one of at least 128 does (720p's 75,600 tokens: 432), else
    :data:`ROWS` with a partial last block."""
    if rows is None:
        fit = [r for r in range(ROWS, 127, -16) if length % r == 0]
        rows = fit[0] if fit else ROWS
    if rows % 8:
        raise ValueError(f"rows={rows} must be a multiple of 8")
    return min(rows, -(-length // 8) * 8)


def _fused(x, w, b, nw, cos, sin, spec: HeadProjection, interpret: bool):
    bsz, length, d = x.shape
    n, _, k = w.shape
    rows = rows_for(length, spec.rows)
    grid = (bsz, pl.cdiv(length, rows))
    args = [x, w.astype(x.dtype)]
    specs = [pl.BlockSpec((1, rows, d), lambda i, j: (i, j, 0)),
             pl.BlockSpec((n, d, k), lambda i, j: (0, 0, 0))]
    if b is not None:
        args.append(b.reshape(n, k))
        specs.append(pl.BlockSpec((n, k), lambda i, j: (0, 0)))
    if spec.norm:
        args.append(nw.astype(jnp.float32).reshape(n, k))
        specs.append(pl.BlockSpec((n, k), lambda i, j: (0, 0)))
    if spec.rope:
        args += [cos.astype(jnp.float32), sin.astype(jnp.float32)]
        specs += [pl.BlockSpec((rows, k), lambda i, j: (j, 0))] * 2
    kernel = functools.partial(_kernel, spec, n, k, b is not None)
    return pl.pallas_call(
        kernel, grid=grid, in_specs=specs,
        out_specs=pl.BlockSpec((1, n, rows, k), lambda i, j: (i, 0, j, 0)),
        out_shape=jax.ShapeDtypeStruct((bsz, n, length, k), x.dtype),
        scratch_shapes=[pltpu.VMEM((n, rows, k), x.dtype)],
        interpret=pltpu.InterpretParams() if interpret else False,
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel"),
                                             vmem_limit_bytes=VMEM_LIMIT),
    )(*args)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7))
def _project(x, w, b, nw, cos, sin, spec, interpret):
    return _fused(x, w, b, nw, cos, sin, spec, interpret)


def _project_fwd(x, w, b, nw, cos, sin, spec, interpret):
    return _fused(x, w, b, nw, cos, sin, spec, interpret), (x, w, b, nw, cos, sin)


def _project_bwd(spec, interpret, res, g):
    _, vjp = jax.vjp(lambda *a: reference(*a, spec), *res)
    return vjp(g)


_project.defvjp(_project_fwd, _project_bwd)


def vmem_bytes(rows: int, n: int, d: int, k: int, rope: bool) -> int:
    """VMEM a grid step holds (bf16): the whole ``[N, D, K]`` kernel and the blocks of x, the
    output and the rotary tables, each double-buffered, and the heads' scratch."""
    tables = 2 * 2 * rows * k * 4 if rope else 0
    return 2 * 2 * (n * d * k + rows * d + n * rows * k) + 2 * n * rows * k + tables


def why_not(x, w, spec: HeadProjection) -> Optional[str]:
    """Why the kernel cannot run on these operands (None: it can): a dtype other than
    bfloat16, a head dim or width off the TPU's 128 lanes, a kernel too large to stay in
    VMEM beside its blocks (Wan 14B's ``[40, 5120, 128]``: 52 MB, twice)."""
    n, d, k = w.shape
    if jnp.dtype(x.dtype) != jnp.bfloat16:
        return f"the compute dtype is {jnp.dtype(x.dtype).name}, not bfloat16"
    if k % LANES or d % LANES:
        return f"head dim {k} and width {d} must be multiples of {LANES}"
    if spec.rope and k % 2:
        return f"RoPE needs an even head dim, not {k}"
    need = vmem_bytes(rows_for(x.shape[-2], spec.rows), n, d, k, spec.rope)
    if need > VMEM_LIMIT * 3 // 4:
        return (f"its [{n}, {d}, {k}] kernel and blocks need {need / 2**20:.0f} MiB of VMEM, "
                f"over {VMEM_LIMIT * 3 // 4 / 2**20:.0f}")
    return None


def project_heads(x, w, b=None, nw=None, rope=None, *, spec: HeadProjection,
                  interpret: bool = False):
    """``x [B, L, D]`` through ``w [N, D, K]`` (+ ``b [N·K]``) → ``[B, N, L, K]`` with
    ``spec``'s norm (weight ``nw [N·K]``), RoPE (``rope`` = (cos, sin) ``[L, K]``) and scale,
    in one Pallas kernel (module docstring); ``interpret``: Pallas' interpreter (CPU)."""
    problem = why_not(x, w, spec)
    if problem:
        raise ValueError(f"project_heads: {problem}; use the XLA projections")
    if spec.norm != (nw is not None) or spec.rope != (rope is not None):
        raise ValueError("project_heads: pass the norm's weight exactly when spec.norm, and "
                         "the RoPE tables exactly when spec.rope")
    cos, sin = rope if rope is not None else (None, None)
    return _project(x, w, b, nw, cos, sin, spec, bool(interpret))


__all__ = ["HeadProjection", "ROWS", "project_heads", "reference", "rms_across_heads",
           "rows_for", "vmem_bytes", "why_not"]
