"""Pallas TPU kernel for the Wan VAE decoder's 3x3 convolutions (the TPU fast path).

:func:`causal_conv3x3` is :class:`~.layers.CausalConv3d`'s ``conv(concat([cache, x]))`` with
one zero pixel of spatial padding (``kt = 3`` time taps), or with ``cache=None`` and a
``[1, 3, 3, C, C_out]`` kernel a per-frame 2-D 3x3 convolution, for channels-last ``[B, F, Y,
X, C]`` activations — without materialising the concatenation, the padded copy, or XLA's
relayouts around its TPU convolution (a Wan 2.1 decode chunk spent more HBM traffic in those
copies and pads than in its convolutions, and XLA's convolution emitter took most of the
compile). Per grid step ``(b, row block i, frame f)`` the kernel holds the ``kt`` input frames
of ``ty + 2`` rows (one halo row above and below) in a ring of ``kt + 1`` VMEM frame buffers:
each step fetches one new frame (DMA, overlapped with the step's products) and does the taps
as ``[r X, C] @ [C, C_out]`` MXU products over sub-blocks of ``r`` rows (at most about 2048
pixels: Mosaic unrolls a product into code as long as its rows, and one kernel of whole
blocks took seconds to compile, 33 of them in a decode program) in a loop over the (time, row)
taps, three products each; the three column taps accumulate unshifted in float32 VMEM and are
rolled by one pixel along the row at the end (``pltpu.roll``; the wrapped pixel masked to the
zero padding).

Epilogues fuse what follows the convolution in the decoder: ``residual=h`` returns ``y + h``,
``act=(gamma, scale)`` returns ``silu(rms_norm(y))`` (the next convolution's input, with
:class:`~.layers.RMSNorm`'s roundings), ``phases=True`` takes ``4 C_out`` output channels
ordered (row parity, column parity, channel) and writes them as a 2x larger frame ``[B, F,
2Y, 2X, C_out]`` (the sub-pixel form of nearest upsampling followed by a 3x3 conv). Outputs of
at most 42 channels (``conv_out``'s 3) put the three column taps side by side in one product's
128 lanes (a third of the MXU passes) and are moved into place with lane rolls.

``pack=c`` (opt-in; :mod:`.conv_tpu_pack`) takes inputs whose channels past ``c`` are padding
(or none: ``c`` = C) and lays the ``3 kt`` (time, row) taps' ``c`` real channels side by side
in one contraction per column tap (96 channels: 7 passes of 128 instead of 9), assembled in
VMEM; one product per column tap also drops the float32 accumulator's per-tap loads and
stores.

Constraints (:func:`supported`): ``C`` a multiple of 128 (the decoder pads its channels to
one on this path: a 96-channel product costs the MXU as much as a 128-channel one, and aligned
ones avoid relayouts), ``X`` a multiple of 8 (rows fold into the product's M dimension: for
free at multiples of 16 in bf16, with a relayout else: Wan 2.1's 480p latent has 104), no row split (:mod:`ditax.nn.halo`). Narrower outputs (``conv_out``'s 3 channels)
compute on 128 lanes and store theirs. ``interpret=True`` runs the kernel in Pallas' TPU
interpret mode (CPU tests).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from ditax.models.vae.wan import conv_tpu_pack

LANES = 128
_TARGET_ELEMS = 1 << 20  # rows * X * max(C, C_out) per frame block: ~2 MiB of bf16
_MXU_ROWS = 2048         # pixels per product: Mosaic's code (and compile time) grows with it
_PACKED_ROWS = 1024      # packed (pack=): straight-line products, no tap loop; half the code
#: products of a multiple of 16 pixels where a divisor allows (bf16's 16-row tiles): packed at
#: 480p the latent's 104-pixel rows went five at a time (520 pixels) where the padded kernel
#: takes ten (1040), one of the suspects of session 62's wrong packed decode on the chip
#: (``benchmarks/vae_conv_pack.py --chip``'s ``packed_unaligned`` sets 1: any count)
_ROW_ALIGN = 16
_VMEM_LIMIT = 100 * 2**20


def supported(shape, cout: int = LANES) -> bool:
    """Whether the kernel takes activations of ``shape`` ``[B, F, Y, X, C]`` to ``cout``."""
    _, _, y, x, c = shape
    return x % 8 == 0 and c % LANES == 0 and block_rows(y, x, max(c, _lanes(cout))) > 0


def block_rows(y: int, x: int, c: int) -> int:
    """Rows per grid step: the largest divisor of ``y`` whose block holds at most about 2^20
    elements (``rows * x * c``); 0 when even one row is larger than that."""
    target = _TARGET_ELEMS // (x * c)
    return max((t for t in range(1, min(y, target) + 1) if y % t == 0), default=0)


def sub_rows(ty: int, x: int, packed: bool = False) -> int:
    """Rows of a block's sub-blocks (one product each): the largest divisor of ``ty`` whose
    product has at most ``_MXU_ROWS`` pixels (packed: ``_PACKED_ROWS``), at least one row;
    of those with a multiple of ``_ROW_ALIGN`` pixels where there is one."""
    limit = min(_MXU_ROWS, _PACKED_ROWS) if packed else _MXU_ROWS
    fits = [r for r in range(1, ty + 1) if ty % r == 0 and (r == 1 or r * x <= limit)]
    return max([r for r in fits if r * x % _ROW_ALIGN == 0] or fits)


def narrow_channels(cout: int, act=None, residual=None, phases: bool = False) -> int:
    """``cout`` where the kernel takes its narrow form (conv_out's 3 channels: the three
    column taps side by side in one product's lanes, no epilogue), else 0."""
    return cout if 3 * cout <= LANES and act is None and residual is None and not phases else 0


def _lanes(c: int) -> int:
    return -(-c // LANES) * LANES


def product_precision(dtype) -> lax.Precision:
    """The precision the kernel's products run at for operands of ``dtype``: bf16 products are
    exact in float32 (DEFAULT); float32 ones follow the ambient ``jax_default_matmul_precision``
    as XLA's convolutions of the plain path do (``model.precision``: ``highest`` / ``float32`` /
    ``high`` / ``tensorfloat32`` → HIGHEST, else DEFAULT: one bfloat16 pass). Pinned in the
    kernel either way: under ``"highest"`` Mosaic refuses bf16 operands."""
    if jnp.dtype(dtype) != jnp.float32:
        return lax.Precision.DEFAULT
    ambient = str(jax.config.jax_default_matmul_precision or "default").lower()
    full = ambient in ("highest", "float32", "high", "tensorfloat32", "bfloat16_3x")
    return lax.Precision.HIGHEST if full else lax.Precision.DEFAULT


def _kernel(*refs, kt: int, ty: int, rows: int, nby: int, frames: int, act_scale,
            residual: bool, phases: bool, narrow: int, prec: lax.Precision, layout=None,
            cols: int = 0):
    it = iter(refs)
    cache_hbm = next(it) if kt > 1 else None
    x_hbm, w_ref, b_ref = next(it), next(it), next(it)
    g_ref = next(it) if act_scale is not None else None
    r_ref = next(it) if residual else None
    o_ref, buf, sem, acc_ref = next(it), next(it), next(it), next(it)
    lhs_ref = next(it) if layout is not None else None
    bi, i, f = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    slots, context = kt + 1, kt - 1
    x_len, c = buf.shape[2], buf.shape[3]
    cout = b_ref.shape[-1]   # the padded outputs (cols: the accumulator is wider)
    height = nby * ty

    def copies(s, slot):
        """(condition, DMA factory) pairs bringing stream frame ``s`` (the cache's frames,
        then x's) rows ``i ty - 1 .. i ty + ty`` into ``buf[slot]`` (rows outside: none)."""
        sources = [(x_hbm, s, None)] if not context else [
            (cache_hbm, jnp.minimum(s, context - 1), s < context),
            (x_hbm, jnp.maximum(s - context, 0), s >= context)]
        out = []
        for src, fi, here in sources:
            rows = ((pl.ds(i * ty, ty), pl.ds(1, ty), None, 0),
                    (pl.ds(jnp.maximum(i * ty - 1, 0), 1), pl.ds(0, 1), i > 0, 1),
                    (pl.ds(jnp.minimum(i * ty + ty, height - 1), 1), pl.ds(ty + 1, 1),
                     i < nby - 1, 2))
            for src_rows, dst_rows, cond, k in rows:
                conds = [v for v in (here, cond) if v is not None]
                out.append((functools.reduce(jnp.logical_and, conds) if conds else None,
                            functools.partial(pltpu.make_async_copy, src.at[bi, fi, src_rows],
                                              buf.at[slot, dst_rows], sem.at[slot, k])))
        return out

    def run(cond, fn):
        if cond is None:
            fn()
        else:
            pl.when(cond)(fn)

    def start(s, slot):
        for cond, dma in copies(s, slot):
            run(cond, lambda dma=dma: dma().start())

    def wait(s, slot):
        for cond, dma in copies(s, slot):
            run(cond, lambda dma=dma: dma().wait())
        zero = jnp.zeros((1, x_len, c), buf.dtype)

        @pl.when(i == 0)
        def _():
            buf[slot, pl.ds(0, 1)] = zero

        @pl.when(i == nby - 1)
        def _():
            buf[slot, pl.ds(ty + 1, 1)] = zero

    @pl.when(f == 0)
    def _():
        for s in range(kt):
            start(s, s)

    @pl.when(f + 1 < frames)
    def _():
        start(f + kt, lax.rem(f + kt, slots))

    if kt > 1:
        @pl.when(f == 0)
        def _():
            for s in range(kt - 1):
                wait(s, s)

    wait(f + kt - 1, lax.rem(f + kt - 1, slots))

    dt, ocols = o_ref.dtype, o_ref.shape[-1]
    m = rows * x_len   # the block's rows go through the MXU ``rows`` at a time (code size)

    def sub_block(j, carry):
        r0 = j * rows

        def lhs_of(t, dy):
            return buf[lax.rem(f + t, slots), pl.ds(r0 + dy, rows)].reshape(m, c)

        def tap(k, carry):   # time tap t, row tap dy: the three column taps into acc[dx]
            t, dy = lax.div(k, 3), lax.rem(k, 3)
            lhs = lhs_of(t, dy)
            for dx in range(acc_ref.shape[0]):
                acc_ref[dx] += jnp.dot(lhs, w_ref[t, dy, dx], precision=prec,
                                       preferred_element_type=jnp.float32)
            return carry

        if layout is None:
            acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)
            lax.fori_loop(0, 3 * kt, tap, 0)
        else:   # all (time, row) taps in one contraction per column tap (conv_tpu_pack)
            conv_tpu_pack.fill(lhs_ref, lambda k: lhs_of(k // 3, k % 3), layout)
            for dx in range(acc_ref.shape[0]):
                acc_ref[dx] = jnp.dot(lhs_ref[...], w_ref[dx], precision=prec,
                                      preferred_element_type=jnp.float32)
        col = lax.rem(lax.broadcasted_iota(jnp.int32, (m, cout), 0), x_len)
        if cols:     # one product for all column taps, side by side in its lanes
            left, centre, right = conv_tpu_pack.columns(acc_ref, cols, cout)
        elif narrow:   # one product for all column taps: lanes (dx = 1, 0, 2) x narrow channels
            centre = acc_ref[0]
            left, right = (pltpu.roll(centre, cout - k * narrow, 1) for k in (1, 2))
        else:
            centre, left, right = acc_ref[1], acc_ref[0], acc_ref[2]
        acc = (centre   # out[x] takes the dx = 0 product at x - 1, the dx = 2 one at x + 1
               + jnp.where(col == 0, 0.0, pltpu.roll(left, 1, 0))
               + jnp.where(col == x_len - 1, 0.0, pltpu.roll(right, m - 1, 0)))
        y = (acc + b_ref[...].astype(jnp.float32)).astype(dt).astype(jnp.float32)
        if residual:
            res = r_ref[pl.ds(r0, rows)].reshape(m, cout).astype(jnp.float32)
            y = (y + res).astype(dt).astype(jnp.float32)
        if act_scale is not None:  # RMSNorm (float32 norm, layers.RMSNorm's roundings), SiLU
            norm = jnp.sqrt(jnp.sum(y * y, axis=-1, keepdims=True))
            u = (y / jnp.maximum(norm, 1e-12)).astype(dt).astype(jnp.float32)
            u = (u * act_scale).astype(dt).astype(jnp.float32)
            u = (u * g_ref[...].astype(jnp.float32)).astype(dt).astype(jnp.float32)
            s = (1.0 / (1.0 + jnp.exp(-u))).astype(dt).astype(jnp.float32)
            y = u * s
        y = y.astype(dt)
        if phases:   # channels (a, b, o): row parity a is an output row, (b, o) its pixels
            half = cout // 2
            for a in range(2):
                o_ref[pl.ds(r0, rows), a] = y[:, a * half:(a + 1) * half].reshape(rows, x_len, half)
        else:
            o_ref[pl.ds(r0, rows)] = y[:, :ocols].reshape(rows, x_len, ocols)
        return carry

    lax.fori_loop(0, ty // rows, sub_block, 0)


def _interpret_params(interpret):
    """``interpret``: False (compiled), True (the default interpret mode: uninitialised
    memory NaN, out-of-bounds reads raise) or a ``pltpu.InterpretParams`` (stricter checks:
    races, eager DMAs, shuffled parallel grid axes)."""
    if isinstance(interpret, pltpu.InterpretParams):
        return interpret
    return pltpu.InterpretParams() if interpret else False


def causal_conv3x3(x: jax.Array, cache: jax.Array | None, w: jax.Array, b: jax.Array, *,
                   act=None, residual: jax.Array | None = None, phases: bool = False,
                   pack: int | None = None, cols: int | None = None,
                   interpret: bool = False) -> jax.Array:
    """``conv3d(concat([cache, x], frames), w)`` (valid in time, one zero pixel around each
    frame) ``+ b``, then the epilogue. x ``[B, F, Y, X, C]``; w ``[kt, 3, 3, C, C_out]``
    with ``kt`` 3 (cache ``[B, 2, Y, X, C]``: the previous frames, zeros at a stream's start)
    or 1 (cache None: a per-frame 2-D conv); b ``[C_out]``. ``residual`` ``[B, F, Y, X,
    C_out]``: return ``y + residual``; ``act=(gamma [C_out], scale)``: return
    ``silu(rms_norm(y) * scale * gamma)``; ``phases``: return ``[B, F, 2Y, 2X, C_out / 4]``
    (see the module); ``pack``: the real input channels (the rest zero padding, ignored):
    the taps packed into the contraction (:mod:`.conv_tpu_pack`); ``cols`` (with ``pack``): the
    real output channels, the column taps side by side in the product's lanes. → ``[B, F, Y,
    X, C_out]`` in x's dtype."""
    bsz, frames, height, x_len, c = x.shape
    kt, cout = w.shape[0], w.shape[-1]
    want_cache = None if kt == 1 else (bsz, kt - 1, height, x_len, c)
    lanes = _lanes(cout)
    if (not supported(x.shape, cout) or w.shape[1:4] != (3, 3, c) or kt not in (1, 3)
            or (None if cache is None else cache.shape) != want_cache
            or (phases and (kt != 1 or cout % (4 * LANES) or act is not None))
            or (lanes != cout and (act is not None or residual is not None))):
        raise ValueError(f"causal_conv3x3: unsupported shapes x {x.shape}, w {w.shape}, cache "
                         f"{None if cache is None else cache.shape}, phases={phases} (C a "
                         f"multiple of {LANES}, X of 8, kernels 3x3x3 with a 2-frame cache "
                         "or 1x3x3 without)")
    if pack is not None:
        conv_tpu_pack.check(pack, c)
    if cols is not None:
        conv_tpu_pack.check_columns(cols, cout, pack, not phases and 3 * cout > LANES)
    ty = block_rows(height, x_len, max(c, lanes))
    nby = height // ty
    sub = sub_rows(ty, x_len, pack is not None)
    dt = x.dtype
    narrow = narrow_channels(cout, act, residual, phases)
    if narrow:   # conv_out's 3 channels: the column taps side by side in one product's lanes
        w = jnp.concatenate([w[:, :, 1], w[:, :, 0], w[:, :, 2]], axis=-1)[:, :, None]
    whole = lambda *shape: pl.BlockSpec(shape, lambda *_: (0,) * len(shape))  # noqa: E731
    rows = pl.BlockSpec((None, None, ty, x_len, cout), lambda bi, i, f: (bi, f, i, 0, 0))
    layout = None if pack is None else conv_tpu_pack.chunks(pack, kt)
    if pack is None:
        w = jnp.pad(w.astype(dt), [(0, 0)] * 4 + [(0, lanes - w.shape[-1])])
    elif cols is not None:
        w = conv_tpu_pack.column_weights(w.astype(dt), pack, cols)
    else:
        w = conv_tpu_pack.weights(w.astype(dt), pack, lanes)
    in_specs = [pl.BlockSpec(memory_space=pl.ANY), whole(*w.shape), whole(1, lanes)]
    args = [x, w, jnp.pad(b.astype(dt), (0, lanes - cout)).reshape(1, lanes)]
    if cache is not None:
        in_specs.insert(0, pl.BlockSpec(memory_space=pl.ANY))
        args.insert(0, cache.astype(dt))
    act_scale = None
    if act is not None:
        gamma, act_scale = act
        in_specs.append(whole(1, cout))
        args.append(gamma.astype(dt).reshape(1, cout))
    if residual is not None:
        in_specs.append(rows)
        args.append(residual.astype(dt))
    if phases:
        out_shape = (bsz, frames, height, 2, x_len, cout // 2)
        out_spec = pl.BlockSpec((None, None, ty, 2, x_len, cout // 2),
                                lambda bi, i, f: (bi, f, i, 0, 0, 0))
    else:
        out_shape, out_spec = (bsz, frames, height, x_len, cout), rows
    kernel = functools.partial(_kernel, kt=kt, ty=ty, rows=sub, nby=nby, frames=frames,
                               narrow=narrow, act_scale=act_scale,
                               residual=residual is not None, phases=phases,
                               prec=product_precision(dt), layout=layout, cols=cols or 0)
    itemsize = jnp.dtype(dt).itemsize
    n, pixels = sub * x_len, bsz * frames * height * x_len
    k_len = 3 * kt * c if pack is None else w.shape[1]   # a column tap's contraction
    taps = 1 if narrow or cols else 3   # float32 accumulators
    acc_lanes = w.shape[-1] if cols else lanes
    vmem = ((kt + 1) * (ty + 2) * x_len * c * itemsize + 2 * 3 * k_len * acc_lanes * itemsize
            + (0 if pack is None else n * k_len * itemsize)
            + 2 * ty * x_len * lanes * itemsize * (2 if residual is not None else 1)
            + 6 * n * acc_lanes * 4)
    cost = pl.CostEstimate(
        flops=2 * k_len * acc_lanes * pixels * taps,
        transcendentals=pixels * cout if act is not None else 0,
        bytes_accessed=itemsize * (pixels * (c * (ty + 2) // ty
                                             + cout * (2 if residual is not None else 1))
                                   + 3 * k_len * acc_lanes))
    y = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(out_shape, dt),
        grid=(bsz, nby, frames),
        in_specs=in_specs,
        out_specs=out_spec,
        scratch_shapes=[pltpu.VMEM((kt + 1, ty + 2, x_len, c), dt),
                        pltpu.SemaphoreType.DMA((kt + 1, 3)),
                        pltpu.VMEM((taps, n, acc_lanes), jnp.float32)]
                       + ([] if pack is None else [pltpu.VMEM((n, k_len), dt)]),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=max(32 * 2**20, min(_VMEM_LIMIT, 2 * vmem))),
        cost_estimate=cost,
        interpret=_interpret_params(interpret),
        name="wan_vae_conv3x3",
    )(*args)
    return y.reshape(bsz, frames, 2 * height, 2 * x_len, cout // 4) if phases else y


__all__ = ["LANES", "block_rows", "causal_conv3x3", "narrow_channels", "sub_rows", "supported"]
