"""Small Pallas probes of the pieces :mod:`.conv_tpu_pack` builds on, each against numpy: a
lane roll (``pltpu.roll``) at the shifts packing uses, the packed operand's assembly
(:func:`~.conv_tpu_pack.fill`) and the column taps' extraction
(:func:`~.conv_tpu_pack.columns`). Interpreted (CPU) they must all be exact — the tests pin
that; compiled on a chip (``benchmarks/vae_conv_pack.py --chip``) a non-zero difference names
the piece Mosaic computes differently, where the whole packed kernel only says "wrong"
(session 62: the packed 480p decode differed from the fast path's by 0.969 on a v5e, exact
interpreted).

Each probe returns one row: ``{"probe": name, ..., "max_abs_diff": float}`` (``error``: the
exception's first line, when it did not compile or run)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from ditax.models.vae.wan import conv_tpu_pack

LANES = conv_tpu_pack.LANES
ROLL_SHIFTS = (1, 16, 32, 64, 96, 127)


def _call(kernel, out_shape, interpret: bool, **kw):
    return pl.pallas_call(kernel, out_shape=out_shape,
                          interpret=pltpu.InterpretParams() if interpret else False,
                          compiler_params=pltpu.CompilerParams(vmem_limit_bytes=100 * 2**20),
                          **kw)


#: set by a deviceless compile check: probes are lowered and compiled, not run
COMPILE_ONLY = None


def _row(name: str, fn, args, want, **info) -> dict:
    """Run ``fn(*args)`` and report its largest difference from ``want`` (or the error).
    With :data:`COMPILE_ONLY` (a callable ``(fn, args)``) only compile."""
    row = {"probe": name, **info}
    try:
        if COMPILE_ONLY is not None:
            COMPILE_ONLY(fn, args)
            return {**row, "compiled": True}
        got = np.asarray(fn(*args), np.float32)
        want = np.asarray(want, np.float32)
        row["max_abs_diff"] = float(np.abs(got - want).max()) if got.shape == want.shape else -1.0
        row["nan"] = int(np.isnan(got).sum())
    except Exception as e:   # a probe that does not compile is a finding too
        row["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"
    return row


def _data(shape, dtype) -> jax.Array:
    """Integers in [-120, 120] (exact in bf16), distinct along the last axis (``7 i mod 241``
    over the flat index), so that a lane or row moved to the wrong place always shows."""
    i = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    return jnp.asarray((7 * i) % 241 - 120, jnp.float32).astype(dtype)


def roll(dtype, axis: int = 1, rows: int = 32, interpret: bool = False) -> dict:
    """``pltpu.roll(x, s, axis)`` for ``s`` in :data:`ROLL_SHIFTS` (below the axis' length)
    against ``jnp.roll`` (the direction packing assumes), ``x`` ``[rows, 128]``."""
    shape = (rows, LANES)
    shifts = tuple(s for s in ROLL_SHIFTS if s < shape[axis])
    x = _data(shape, dtype)

    def kernel(x_ref, o_ref):
        for i, s in enumerate(shifts):
            o_ref[i] = pltpu.roll(x_ref[...], s, axis)

    fn = jax.jit(_call(kernel, jax.ShapeDtypeStruct((len(shifts), *shape), dtype), interpret))
    want = np.stack([np.roll(np.asarray(x, np.float32), s, axis) for s in shifts])
    return _row("roll", fn, (x,), want, dtype=jnp.dtype(dtype).name, axis=axis,
                shape=list(shape), shifts=list(shifts))


def fill(pack: int, kt: int, x: int, dtype, rows: int = 1, interpret: bool = False,
         assembly=None) -> dict:
    """:func:`~.conv_tpu_pack.fill` as the kernel calls it — each tap a ``[rows, x, C]``
    window at a run-time row offset of a frame buffer, reshaped to ``[rows x, C]`` — against
    the layout computed in numpy (tap ``k``'s channel ``i`` at lane ``k pack + i``, zeros past
    ``3 kt pack``). The buffer's padded channels hold values too, which must not leak.
    ``assembly``: :data:`~.conv_tpu_pack.ASSEMBLY_DTYPE` while it traces."""
    c = -(-pack // LANES) * LANES
    layout = conv_tpu_pack.chunks(pack, kt)
    k_len, taps, m = len(layout) * LANES, 3 * kt, rows * x
    buf = _data((taps, rows + 2, x, c), dtype)

    def kernel(b_ref, o_ref):
        r0 = pl.program_id(0)   # 0, but unknown to the compiler: the kernel's dynamic offset
        saved, conv_tpu_pack.ASSEMBLY_DTYPE = conv_tpu_pack.ASSEMBLY_DTYPE, assembly
        try:
            conv_tpu_pack.fill(o_ref, lambda k: b_ref[k, pl.ds(r0 + k % 3, rows)].reshape(m, c),
                               layout)
        finally:
            conv_tpu_pack.ASSEMBLY_DTYPE = saved

    fn = jax.jit(_call(kernel, jax.ShapeDtypeStruct((m, k_len), dtype), interpret, grid=(1,),
                       in_specs=[pl.BlockSpec(buf.shape, lambda i: (0,) * 4)],
                       out_specs=pl.BlockSpec((m, k_len), lambda i: (0, 0))))
    b = np.asarray(buf, np.float32)
    want = np.zeros((m, k_len), np.float32)
    for k in range(taps):
        want[:, k * pack:(k + 1) * pack] = b[k, k % 3:k % 3 + rows].reshape(m, c)[:, :pack]
    return _row("fill", fn, (buf,), want, pack=pack, kt=kt, x=x, rows=rows,
                dtype=jnp.dtype(dtype).name,
                assembly=jnp.dtype(assembly or dtype).name)


def columns(cols: int, m: int = 32, interpret: bool = False) -> dict:
    """:func:`~.conv_tpu_pack.columns`: the three column taps' ``cols`` lanes out of one
    ``[m, ceil(3 cols / 128) 128]`` float32 product, zeros past ``cols``."""
    lanes = -(-cols // LANES) * LANES
    acc = _data((1, m, -(-3 * cols // LANES) * LANES), jnp.float32)

    def kernel(a_ref, o_ref):
        for dx, v in enumerate(conv_tpu_pack.columns(a_ref, cols, lanes)):
            o_ref[dx] = v

    fn = jax.jit(_call(kernel, jax.ShapeDtypeStruct((3, m, lanes), jnp.float32), interpret))
    a = np.asarray(acc)[0]
    want = np.zeros((3, m, lanes), np.float32)
    for dx in range(3):
        want[dx, :, :cols] = a[:, dx * cols:(dx + 1) * cols]
    return _row("columns", fn, (acc,), want, cols=cols, m=m)


#: (pack, kt, pixels a row, rows a product) of the decoder's packed kernels at 480x832:
#: conv_in (16 of 128) and the 384-wide convolutions at 60x104 in products of 4 rows (416
#: pixels) and, as before ``conv_tpu._ROW_ALIGN``, 5 (520: not a multiple of bf16's 16-row
#: tiles), 192 in / 384 at 120x208, 192 at 240x416 (causal and upsampling), 96 at 480x832
FILLS = ((16, 3, 104, 5), (16, 3, 104, 4), (384, 3, 104, 5), (384, 3, 104, 4),
         (384, 1, 104, 6), (192, 3, 208, 4), (384, 3, 208, 4), (192, 3, 416, 2),
         (192, 1, 416, 2), (96, 3, 832, 1))


def all_rows(interpret: bool = False, fills=FILLS) -> list[dict]:
    """Every probe the chip run prints: rolls (bf16 / f32 lanes, f32 rows), the assembly at
    ``fills`` (:data:`FILLS`: the decoder's) in bf16 (assembled in bf16 and in float32) and
    float32, the columns at 192 (832
    pixels, the 240x416 level's products; 32 with other ``fills``)."""
    rows = [roll(dt, 1, interpret=interpret) for dt in (jnp.bfloat16, jnp.float32)]
    rows.append(roll(jnp.float32, 0, rows=256, interpret=interpret))
    for pack, kt, x, r in fills:
        for dt, via in ((jnp.bfloat16, None), (jnp.bfloat16, jnp.float32), (jnp.float32, None)):
            rows.append(fill(pack, kt, x, dt, rows=r, interpret=interpret, assembly=via))
    rows.append(columns(192, m=832 if fills is FILLS else 32, interpret=interpret))
    return rows


__all__ = ["FILLS", "ROLL_SHIFTS", "all_rows", "columns", "fill", "roll"]
