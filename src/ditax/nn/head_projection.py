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

:func:`project_many` runs several projections of one input in one kernel and can take the
block's norm with it (``pre``: a LayerNorm of the rows with one sample's ``* mul + add``, as
Wan's ``norm1`` with its adaLN terms or its affine ``norm2``), computed on each row block in
VMEM, so the normed input is never written: Wan's self-attention gets q, k and v from one
three-output kernel, its cross-attention the query from another.

Same values as the XLA path (:func:`reference`), rounded at the same points: the product
and the bias in ``x.dtype``, the norm in float32 rounded once, RoPE in float32 rounded
once, the softmax scale in float32 rounded once (the attention kernel's own pass). Only the
order of the products' and the norm's float32 sums differs.

Measured on a v5e in the 480x832x81 forward (session 64, ``docs/tpu_v5e.md``): the q, k and
cross-attention q kernels 28.2, 27.7 and 25.6 ms a forward (~164 TFLOP/s for q) where XLA's
projections with their norm statistics, RoPE and the query's norm pass took 128.8 ms. A
software-pipelined variant (block ``j``'s products beside block ``j - 1``'s epilogue in one
basic block, float32 kept from the accumulator in a double-buffered scratch) ran slower:
30.9 ms for q and k. Session 65, with the norms inside: q, k and v from norm1 75.9 ms where
the two kernels, XLA's v and its normed input took 89.5 ms, the cross query 28.0 ms against
34.8; the forward 1.6333 s (from 1.6564).

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

from ditax.nn.norms import layer_norm
from ditax.nn.rope import apply_rope

LANES = 128
#: token rows a grid step; fewer where the length is shorter (a multiple of 8)
ROWS = 512
VMEM_LIMIT = 96 * 2**20
#: whether Wan's layers hand the kernels their hidden state transposed (``[B, D, L]``,
#: :func:`project_many` ``transposed``), so that XLA may keep it features-major (``{1,2,0}``,
#: its choice without the kernels: the FFN's down projection 143 ms a 480p forward on a v5e
#: against 161 ms rows-major, session 64). Off until the chip has timed it
#: (``benchmarks/tpu_sweep.py --part wan_transposed`` turns it on for its case).
TRANSPOSED_INPUT = False


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


def pre_norm(x, mul, add, eps: float):
    """The block's input norm as XLA computes it: ``(layer_norm(x) * mul + add)`` in float32,
    rounded once to ``x.dtype`` (Wan's ``norm1`` with the adaLN ``1 + scale`` / ``shift``, or
    an affine ``norm2`` with its weight / bias)."""
    return (layer_norm(x, eps) * mul + add).astype(x.dtype)


def reference_many(x, ws, bs, nws, cos, sin, mul, add, specs, pre_eps=None):
    """:func:`reference` for each projection of one input (``ws`` / ``bs`` / ``nws`` / ``specs``
    one each), the input first through :func:`pre_norm` when ``pre_eps`` is given."""
    if pre_eps is not None:
        x = pre_norm(x, mul, add, pre_eps)
    return tuple(reference(x, w, b, nw, cos, sin, s) for w, b, nw, s in zip(ws, bs, nws, specs))


def _partner(y):
    """Each channel's signed RoPE partner within a head's ``K`` lanes: ``−y[2i+1]`` at
    ``2i``, ``y[2i]`` at ``2i+1`` (two lane rolls, as :func:`jnp.roll` turns)."""
    k = y.shape[-1]
    even = jax.lax.broadcasted_iota(jnp.int32, y.shape, y.ndim - 1) % 2 == 0
    return jnp.where(even, -pltpu.roll(y, k - 1, y.ndim - 1), pltpu.roll(y, 1, y.ndim - 1))


def _finish(y, spec: HeadProjection, dt, r=None, nw=None, cos=None, sin=None):
    """One head's epilogue on its product ``y``: norm (``r`` the rows' reciprocal RMS, ``nw``
    the head's weights), RoPE, scale, each rounded where the XLA path rounds."""
    y = y.astype(jnp.float32)
    if spec.norm:
        y = (y * r * nw.astype(jnp.float32)).astype(dt).astype(jnp.float32)
    if spec.rope:
        y = (y * cos + _partner(y) * sin).astype(dt).astype(jnp.float32)
    if spec.scale != 1.0:
        y = y * spec.scale
    return y.astype(dt)


def _kernel(specs, pre_eps, transposed: bool, n: int, k: int, has_bias, *refs):
    refs = list(refs)
    x_ref = refs.pop(0)
    m_ref, a_ref = (refs.pop(0), refs.pop(0)) if pre_eps is not None else (None, None)
    layers = []
    for spec, hb in zip(specs, has_bias):
        w_ref = refs.pop(0)
        b_ref = refs.pop(0) if hb else None
        layers.append((spec, w_ref, b_ref, refs.pop(0) if spec.norm else None))
    rope = any(s.rope for s in specs)
    cos_ref, sin_ref = (refs.pop(0), refs.pop(0)) if rope else (None, None)
    outs, y_scr = refs[:len(specs)], refs[len(specs)]
    dt = outs[0].dtype
    x = x_ref[0]                                               # [rows, D]
    if transposed:         # [D, rows] read: transposed in float32 (exact), rows-major after
        x = x.astype(jnp.float32).T
        x = x if pre_eps is not None else x.astype(dt)
    if pre_eps is not None:                                    # pre_norm's steps
        xf = x.astype(jnp.float32)
        c = xf - jnp.mean(xf, axis=1, keepdims=True)
        r = jax.lax.rsqrt(jnp.mean(c * c, axis=1, keepdims=True) + pre_eps)
        x = (c * r * m_ref[0] + a_ref[0]).astype(dt)
    tables = dict(cos=cos_ref[...], sin=sin_ref[...]) if rope else {}
    for (spec, w_ref, b_ref, nw_ref), o_ref in zip(layers, outs):
        rt = tables if spec.rope else {}
        ss = jnp.zeros((x.shape[0], 1), jnp.float32)
        for h in range(n):
            y = jax.lax.dot_general(x, w_ref[h], (((1,), (0,)), ((), ())),
                                    preferred_element_type=jnp.float32).astype(dt)
            if b_ref is not None:
                y = (y.astype(jnp.float32) + b_ref[pl.ds(h, 1), :].astype(dt).astype(
                    jnp.float32)).astype(dt)
            if spec.norm:      # every head's rows wait in VMEM for the norm's statistics
                yf = y.astype(jnp.float32)
                ss = ss + jnp.sum(yf * yf, axis=1, keepdims=True)
                y_scr[h] = y
            else:
                o_ref[0, h] = _finish(y, spec, dt, **rt)
        if spec.norm:
            r = jax.lax.rsqrt(ss * (1.0 / (n * k)) + spec.eps)
            for h in range(n):
                o_ref[0, h] = _finish(y_scr[h], spec, dt, r, nw_ref[pl.ds(h, 1), :], **rt)


def rows_for(length: int, rows: Optional[int] = None, unit: int = 16) -> int:
    """Token rows a grid step: ``rows`` (a multiple of 8) clipped to the length rounded up to
    8; by default the largest multiple of ``unit`` (16: bf16's sublane tile; 128 where the
    tokens lie along lanes, a transposed input) up to :data:`ROWS` that divides the length,
    when one of at least 128 does (720p's 75,600 tokens: 432), else :data:`ROWS` with a
    partial last block."""
    if rows is None:
        fit = [r for r in range(ROWS, 127, -unit) if length % r == 0]
        rows = fit[0] if fit else ROWS
    step = 8 if unit == 16 else unit      # a block's rows: sublanes (8) or whole lanes
    if rows % step:
        raise ValueError(f"rows={rows} must be a multiple of {step}")
    return min(rows, -(-length // 8) * 8) if unit == 16 else min(rows, length)


def _fused(x, ws, bs, nws, cos, sin, mul, add, specs, pre_eps, transposed: bool,
           interpret: bool):
    if transposed:      # x [B, D, L]: blocks of whole 128-lane columns of tokens
        bsz, d, length = x.shape
        rows = rows_for(length, specs[0].rows, LANES)
        args, in_specs = [x], [pl.BlockSpec((1, d, rows), lambda i, j: (i, 0, j))]
    else:
        bsz, length, d = x.shape
        rows = rows_for(length, specs[0].rows)
        args, in_specs = [x], [pl.BlockSpec((1, rows, d), lambda i, j: (i, j, 0))]
    n, _, k = ws[0].shape
    if pre_eps is not None:
        for t in (mul, add):
            args.append(jnp.broadcast_to(t.astype(jnp.float32), (bsz, 1, d)))
            in_specs.append(pl.BlockSpec((1, 1, d), lambda i, j: (i, 0, 0)))
    per_head = pl.BlockSpec((n, k), lambda i, j: (0, 0))
    for w, b, nw, spec in zip(ws, bs, nws, specs):
        args.append(w.astype(x.dtype))
        in_specs.append(pl.BlockSpec((n, d, k), lambda i, j: (0, 0, 0)))
        if b is not None:
            args.append(b.reshape(n, k))
            in_specs.append(per_head)
        if spec.norm:
            args.append(nw.astype(jnp.float32).reshape(n, k))
            in_specs.append(per_head)
    if any(s.rope for s in specs):
        args += [cos.astype(jnp.float32), sin.astype(jnp.float32)]
        in_specs += [pl.BlockSpec((rows, k), lambda i, j: (j, 0))] * 2
    kernel = functools.partial(_kernel, specs, pre_eps, transposed, n, k,
                               tuple(b is not None for b in bs))
    out = jax.ShapeDtypeStruct((bsz, n, length, k), x.dtype)
    return pl.pallas_call(
        kernel, grid=(bsz, pl.cdiv(length, rows)), in_specs=in_specs,
        out_specs=[pl.BlockSpec((1, n, rows, k), lambda i, j: (i, 0, j, 0))] * len(specs),
        out_shape=[out] * len(specs),
        scratch_shapes=[pltpu.VMEM((n, rows, k), x.dtype)],
        interpret=pltpu.InterpretParams() if interpret else False,
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel"),
                                             vmem_limit_bytes=VMEM_LIMIT),
    )(*args)


@functools.partial(jax.custom_vjp, nondiff_argnums=(8, 9, 10, 11))
def _project(x, ws, bs, nws, cos, sin, mul, add, specs, pre_eps, transposed, interpret):
    return tuple(_fused(x, ws, bs, nws, cos, sin, mul, add, specs, pre_eps, transposed,
                        interpret))


def _project_fwd(x, ws, bs, nws, cos, sin, mul, add, specs, pre_eps, transposed, interpret):
    return (_project(x, ws, bs, nws, cos, sin, mul, add, specs, pre_eps, transposed, interpret),
            (x, ws, bs, nws, cos, sin, mul, add))


def _project_bwd(specs, pre_eps, transposed, interpret, res, g):
    def ref(x, *a):
        return reference_many(jnp.swapaxes(x, 1, 2) if transposed else x, *a, specs, pre_eps)

    _, vjp = jax.vjp(ref, *res)
    return vjp(tuple(g))


_project.defvjp(_project_fwd, _project_bwd)


def vmem_bytes(rows: int, n: int, d: int, k: int, rope: bool, count: int = 1,
               pre: bool = False) -> int:
    """VMEM a grid step holds (bf16): ``count`` whole ``[N, D, K]`` kernels and the blocks of
    x, the outputs and the rotary tables, each double-buffered, the heads' scratch, and with
    ``pre`` the input norm's float32 rows."""
    tables = 2 * 2 * rows * k * 4 if rope else 0
    norm = 2 * rows * d * 4 if pre else 0
    return (2 * 2 * (count * n * d * k + rows * d + count * n * rows * k) + 2 * n * rows * k
            + tables + norm)


def why_not(x, w, spec: HeadProjection, count: int = 1, pre: bool = False) -> Optional[str]:
    """Why the kernel cannot run on these operands (None: it can): a dtype other than
    bfloat16, a head dim or width off the TPU's 128 lanes, kernels too large to stay in
    VMEM beside their blocks (Wan 14B's ``[40, 5120, 128]``: 52 MB, twice); ``count``
    projections of one input, ``pre`` with its input norm (:func:`project_many`)."""
    n, d, k = w.shape
    if jnp.dtype(x.dtype) != jnp.bfloat16:
        return f"the compute dtype is {jnp.dtype(x.dtype).name}, not bfloat16"
    if k % LANES or d % LANES:
        return f"head dim {k} and width {d} must be multiples of {LANES}"
    if spec.rope and k % 2:
        return f"RoPE needs an even head dim, not {k}"
    need = vmem_bytes(rows_for(x.shape[-2], spec.rows), n, d, k, spec.rope, count, pre)
    if need > VMEM_LIMIT * 3 // 4:
        return (f"{'its' if count == 1 else count} [{n}, {d}, {k}] kernel"
                f"{'' if count == 1 else 's'} and blocks need {need / 2**20:.0f} MiB of VMEM, "
                f"over {VMEM_LIMIT * 3 // 4 / 2**20:.0f}")
    return None


def project_many(x, layers, rope=None, pre=None, *, transposed: bool = False,
                 interpret: bool = False) -> tuple:
    """Several projections of one input ``x [B, L, D]`` in one kernel, each as
    :func:`project_heads` computes it: ``layers`` a sequence of ``(w, b, nw, spec)``, the
    same ``[N, D, K]`` shape (``rows`` from the first spec); ``pre`` = ``(mul, add, eps)``:
    the input is first ``pre_norm(x, mul, add, eps)`` (``mul`` / ``add`` ``[D]`` or
    ``[B, 1, D]``: one modulation per sample), normalized in VMEM and never written (Wan's
    ``q, k, v`` from ``norm1`` with the adaLN terms; the cross-attention's query from
    ``norm2``). ``transposed``: ``x`` is given as ``[B, D, L]`` (the kernel transposes each
    block in VMEM; where XLA keeps the hidden state features-major, ``{1,2,0}``, that view is
    free: :data:`TRANSPOSED_INPUT`). Returns one ``[B, N, L, K]`` each."""
    ws, bs, nws, specs = (tuple(t) for t in zip(*layers))
    shape = (x.shape[0], x.shape[2], x.shape[1]) if transposed else x.shape   # [B, L, D]
    d = shape[-1]
    problem = (why_not(jax.ShapeDtypeStruct(shape, x.dtype), ws[0], specs[0], len(ws),
                       pre is not None)
               or next((f"kernels {w.shape} and {ws[0].shape} differ" for w in ws
                        if w.shape != ws[0].shape), None))
    if problem:
        raise ValueError(f"project_heads: {problem}; use the XLA projections")
    if (any(s.norm != (nw is not None) for s, nw in zip(specs, nws))
            or any(s.rope for s in specs) != (rope is not None)):
        raise ValueError("project_heads: pass the norm's weight exactly when spec.norm, and "
                         "the RoPE tables exactly when spec.rope (in any of the layers)")
    mul = add = pre_eps = None
    if pre is not None:
        mul, add, pre_eps = pre
        for t in (mul, add):
            if t.shape[-1] != d or t.ndim > 3 or (t.ndim == 3 and t.shape[1] != 1):
                raise ValueError(f"project_heads: the input norm's terms are {t.shape}, not "
                                 f"[{d}] or [B, 1, {d}] (per-token terms: apply pre_norm "
                                 f"first)")
        mul, add = (t.reshape((-1, 1, d)) for t in (mul, add))
    cos, sin = rope if rope is not None else (None, None)
    return _project(x, ws, bs, nws, cos, sin, mul, add, specs,
                    None if pre_eps is None else float(pre_eps), bool(transposed),
                    bool(interpret))


def project_heads(x, w, b=None, nw=None, rope=None, *, spec: HeadProjection,
                  interpret: bool = False):
    """``x [B, L, D]`` through ``w [N, D, K]`` (+ ``b [N·K]``) → ``[B, N, L, K]`` with
    ``spec``'s norm (weight ``nw [N·K]``), RoPE (``rope`` = (cos, sin) ``[L, K]``) and scale,
    in one Pallas kernel (module docstring); ``interpret``: Pallas' interpreter (CPU)."""
    return project_many(x, [(w, b, nw, spec)], rope, interpret=interpret)[0]


__all__ = ["HeadProjection", "ROWS", "TRANSPOSED_INPUT", "pre_norm", "project_heads",
           "project_many", "reference", "reference_many", "rms_across_heads", "rows_for",
           "vmem_bytes", "why_not"]
