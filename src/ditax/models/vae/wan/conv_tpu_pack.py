"""Tap packing for :mod:`.conv_tpu`: the real channels of several taps in one contraction.

The kernel's activations carry channels padded to a multiple of 128 (Wan 2.1's 96 → 128, 192
→ 256), and each of its ``3 kt`` (time, row) taps is a product with ``K`` = the padded
channels: at 96 real channels 27 passes of 128 where the useful work is 20.25. Packed
(``causal_conv3x3(..., pack=c)``, ``c`` the real channels), a sub-block's ``3 kt`` taps are
laid side by side in the contraction — tap ``k``'s channel ``i`` at position ``k c + i`` of
``K = ceil(3 kt c / 128) * 128`` — and each column tap is one product of that ``K``: at 96
channels 7 passes instead of 9 a column tap, at 192 14 instead of 18; the column taps and the
epilogues are the unpacked kernel's. One product per column tap also spares the unpacked
kernel's float32 accumulator a load and a store per tap, which is why ``pack=c`` with ``c``
a multiple of 128 (nothing to pack: the taps' whole widths side by side) is allowed too.
Mosaic has no cheap lane concatenation at offsets that are not multiples of 128, so each
128-lane chunk of the packed operand is assembled from lane-rolled (``pltpu.roll``) 128-lane
pieces of the taps, selected by lane, and stored at its aligned place in a VMEM scratch
``[rows X, K]`` (lanes past ``3 kt c`` zero); bf16 taps in float32, stored in 256-lane pairs
(:data:`ASSEMBLY_DTYPE`).

``cols=o`` (with ``pack``; ``o`` the real output channels) also puts the three column taps'
outputs side by side in the product's lanes — one ``[rows X, K] @ [K, ceil(3 o / 128) 128]``
product, 5 output passes instead of 6 at 192 channels — and takes each tap's ``o`` lanes back
out with lane rolls (:func:`columns`).

:func:`chunks` is that layout (static), :func:`weights` / :func:`column_weights` the matching
weights, :func:`fill` the kernel's assembly, :func:`passes` the MXU passes of a column tap
either way, :func:`saves_columns` whether ``cols`` saves output passes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental.pallas import tpu as pltpu

LANES = 128
#: the dtype :func:`fill` rolls and selects the taps' pieces in before storing them in the
#: operand's (read at trace time). float32: bf16 taps converted whole, chunks stored in
#: 256-lane pairs — no bf16 value at an odd 128-lane offset, which only packing had (a suspect
#: of session 62's chip result) and statically a little shorter (libtpu's v5e schedule: 0.68
#: of the padded kernel against 0.70 at 96 channels). None: the operand's own, session 62's
#: (``benchmarks/vae_conv_pack.py --chip``'s ``packed_bf16asm``).
ASSEMBLY_DTYPE = jnp.float32


def _lanes(c: int) -> int:
    return -(-c // LANES) * LANES


def passes(c: int, kt: int, pack: bool) -> int:
    """MXU contraction passes of one column tap's products over the ``3 kt`` (time, row)
    taps at ``c`` real input channels: ``3 kt`` products of the padded width, or one packed."""
    return _lanes(3 * kt * c) // LANES if pack else 3 * kt * (_lanes(c) // LANES)


def check(pack: int, c: int) -> None:
    """Raise (one line) unless ``pack`` real channels fit the padded width ``c`` as packing
    wants them: ``0 < pack <= c`` and ``c`` the 128-multiple at or just above ``pack``."""
    if not (0 < pack <= c and _lanes(pack) == c):
        raise ValueError(f"causal_conv3x3: pack={pack} does not fit inputs of {c} channels "
                         f"(pack is the real channels of inputs padded to the next multiple "
                         f"of {LANES}: e.g. 96 for 128, 192 for 256, or {c} itself; or leave "
                         "pack=None)")


def saves_columns(cols: int) -> bool:
    """Whether ``cols`` real output channels side by side take fewer 128-lane passes than
    three padded outputs (192: 5 of 6; 96 or 384: as many)."""
    return _lanes(3 * cols) < 3 * _lanes(cols)


def check_columns(cols: int, cout: int, pack, plain_outputs: bool) -> None:
    """Raise (one line) unless ``cols`` fits: with ``pack``, outputs padded to the 128-multiple
    ``cout`` at or just above ``cols``, neither ``phases`` nor the narrow form."""
    if pack is None or not plain_outputs or not (0 < cols <= cout and _lanes(cols) == cout):
        raise ValueError(f"causal_conv3x3: cols={cols} needs pack= and outputs of {cols} real "
                         f"channels padded to the next multiple of {LANES} (here {cout}), "
                         "without phases and wider than 42; else leave cols=None")


def chunks(pack: int, kt: int) -> tuple[tuple[tuple[int, int, int, int, int], ...], ...]:
    """The packed operand's 128-lane chunks, each a tuple of pieces ``(tap k, source chunk
    q, roll d, lane lo, lane hi)``: lanes ``lo .. hi`` of the chunk are
    ``roll(tap_k[:, 128 q : 128 q + 128], d)``'s, where ``tap_k`` is the (time, row) tap
    ``k = 3 t + dy``'s ``[rows X, C]`` operand; lanes no piece covers are zero."""
    out = [[] for _ in range(_lanes(3 * kt * pack) // LANES)]
    for k in range(3 * kt):
        for q in range(_lanes(pack) // LANES):
            width = min(LANES, pack - q * LANES)
            start = k * pack + q * LANES          # where the piece's lane 0 lands
            j, d = divmod(start, LANES)
            out[j].append((k, q, d, d, min(LANES, d + width)))
            if d + width > LANES:
                out[j + 1].append((k, q, d, 0, d + width - LANES))
    return tuple(tuple(c) for c in out)


def weights(w: jax.Array, pack: int, lanes: int) -> jax.Array:
    """``[kt, 3, D, C, N]`` kernel (``D`` column taps, or 1 for the narrow form) → ``[D, K,
    lanes]``: contraction row ``(3 t + dy) pack + i`` is ``w[t, dy, :, i]``, zeros past
    ``3 kt pack`` and past ``N``."""
    kt, _, d, _, n = w.shape
    w = w[:, :, :, :pack].transpose(2, 0, 1, 3, 4).reshape(d, 3 * kt * pack, n)
    return jnp.pad(w, [(0, 0), (0, _lanes(3 * kt * pack) - 3 * kt * pack), (0, lanes - n)])


def column_weights(w: jax.Array, pack: int, cols: int) -> jax.Array:
    """``[kt, 3, 3, C, N]`` → ``[1, K, ceil(3 cols / 128) 128]``: output lane ``dx cols + o`` is
    column tap ``dx``'s channel ``o``."""
    w = weights(w[..., :cols], pack, cols)
    w = w.transpose(1, 0, 2).reshape(1, w.shape[1], 3 * cols)
    return jnp.pad(w, [(0, 0), (0, 0), (0, _lanes(3 * cols) - 3 * cols)])


def columns(acc_ref, cols: int, lanes: int) -> list[jax.Array]:
    """The three column taps' ``[m, lanes]`` products (zeros past ``cols``) out of
    ``acc_ref[0]`` ``[m, ceil(3 cols / 128) 128]`` (float32, lanes as :func:`column_weights`)."""
    m = acc_ref.shape[1]
    lane = lax.broadcasted_iota(jnp.int32, (m, LANES), 1)
    rolled = {}

    def chunk(i, d):   # roll(c, 128 - d)[l] = c[(l + d) % 128]
        if (i, d) not in rolled:
            c = acc_ref[0, :, i * LANES:(i + 1) * LANES]
            rolled[(i, d)] = c if d == 0 else pltpu.roll(c, LANES - d, 1)
        return rolled[(i, d)]

    out = []
    for dx in range(3):
        first, d = divmod(dx * cols, LANES)
        parts = []
        for jo in range(lanes // LANES):
            valid = min(LANES, cols - jo * LANES)
            if valid <= 0:
                parts.append(jnp.zeros((m, LANES), jnp.float32))
                continue
            v = chunk(first + jo, d)
            if d + valid > LANES:   # lanes from 128 - d on come from the next chunk
                v = jnp.where(lane < LANES - d, v, chunk(first + jo + 1, d))
            parts.append(v if valid == LANES else jnp.where(lane < valid, v, 0.0))
        out.append(parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=1))
    return out


def fill(lhs_ref, tap, layout) -> None:
    """Assemble the packed operand into ``lhs_ref`` ``[m, K]`` (VMEM): ``tap(k)`` is the
    ``[m, C]`` operand of (time, row) tap ``k``; ``layout``: :func:`chunks`'. Every lane of
    every chunk is written (zeros where no piece lies), each call. With
    :data:`ASSEMBLY_DTYPE` wider than the operand's, each tap is converted whole, its pieces
    rolled and selected in that type, and the chunks stored in 256-lane pairs: no operand-
    dtype value at an odd 128-lane offset (bf16 VMEM tiles here are 8 rows x 256 lanes a
    vector register, Mosaic's dump; the fast path never slices bf16 at 128)."""
    m, dt = lhs_ref.shape[0], lhs_ref.dtype
    via = jnp.dtype(ASSEMBLY_DTYPE or dt)
    wide = via.itemsize > jnp.dtype(dt).itemsize
    lane = lax.broadcasted_iota(jnp.int32, (m, LANES), 1)
    loaded, whole, pending = {}, {}, None
    for j, pieces in enumerate(layout):
        chunk = jnp.zeros((m, LANES), via)
        for k, q, d, lo, hi in pieces:
            key = (k, q)
            if key not in loaded:   # a piece split over two chunks is loaded and rolled once
                if wide:
                    whole = whole if k in whole else {k: tap(k).astype(via)}
                    src = whole[k][:, q * LANES:(q + 1) * LANES]
                else:
                    src = tap(k)[:, q * LANES:(q + 1) * LANES]
                loaded = {key: src if d == 0 else pltpu.roll(src, d, 1)}
            piece = loaded[key]
            if lo == 0 and hi == LANES:
                chunk = piece
            else:
                chunk = jnp.where((lane >= lo) & (lane < hi), piece, chunk)
        if not wide:
            lhs_ref[:, j * LANES:(j + 1) * LANES] = chunk
        elif j % 2 == 0:
            pending = chunk
        else:   # two chunks, one 256-lane store at an even offset
            pair = jnp.concatenate([pending, chunk], axis=1).astype(dt)
            lhs_ref[:, (j - 1) * LANES:(j + 1) * LANES] = pair
            pending = None
    if pending is not None:   # an odd count: the last chunk alone, at an even offset
        lhs_ref[:, (len(layout) - 1) * LANES:] = pending.astype(dt)


__all__ = ["check", "check_columns", "chunks", "column_weights", "columns", "fill", "passes",
           "saves_columns", "weights"]
