"""Block-sparse flash: the kernels visit only the live key blocks of each query block (and, in
the dk/dv backward, only the live query blocks of each key block) of a
:class:`~ditax.attention.sparse.masks.BlockTable` (the tokens tile-major).

The table is turned, once per trace (numpy), into block lists (:func:`block_lists`): for each
row block (the kernel's resident side) the ids of its live column blocks, padded with the last
live id to the longest row's count, and that count. The lists travel as scalar-prefetched
operands (SMEM): the innermost grid axis runs over list positions, the index maps read the
block id at a position (:func:`listed_specs`), and a kernel computes only on positions below
its row's count (:func:`live`). A padded position repeats the previous block id, so its DMA is
skipped as well. Work and traffic then follow the table's density, not the dense grid's.

Exactness: each kernel block must lie inside one tile (``tile_len % block == 0``), so a block
is kept or skipped whole and no element mask is needed; blocks past the table (padding) are
dead. The online softmax, the masks of padded keys and the backward's recomputation are the
dense kernels' own, on fewer blocks.
"""

from __future__ import annotations

import numpy as np
from jax.experimental import pallas as pl

from ditax.intmath import ceil_div


def block_lists(table, rows: int, cols: int, block_r: int, block_c: int,
                transpose: bool = False):
    """``(ids int32 [n_r * width], counts int32 [n_r], width)``: the live column blocks of each
    row block of a ``rows x cols`` attention (query x key, or key x query with
    ``transpose``) in blocks of ``block_r x block_c`` tokens, from ``table``'s tiles."""
    t = table.tile_len
    for name, b in (("query", block_r), ("key", block_c)):
        if t % b:
            raise ValueError(f"flash with a block table: a {name} block of {b} tokens is not "
                             f"inside one {t}-token tile; use blocks that divide the tile "
                             f"(e.g. block_q=block_kv={t}) or attention.tile of {b}·k tokens")
    tiles = table.table.T if transpose else table.table
    n_r, n_c = ceil_div(rows, block_r), ceil_div(cols, block_c)
    tile_r = np.arange(n_r) * block_r // t          # the tile of each block (past: >= n)
    tile_c = np.arange(n_c) * block_c // t
    n = table.tiles
    live = np.zeros((n_r, n_c), bool)
    inside_r, inside_c = tile_r < n, tile_c < n
    live[np.ix_(inside_r, inside_c)] = tiles[np.ix_(tile_r[inside_r], tile_c[inside_c])]
    counts = live.sum(1).astype(np.int32)
    width = max(1, int(counts.max(initial=0)))
    ids = np.zeros((n_r, width), np.int32)
    for r in range(n_r):
        got = np.nonzero(live[r])[0]
        if got.size:
            ids[r, :got.size] = got
            ids[r, got.size:] = got[-1]          # repeat: the same block, no new DMA
    return ids.reshape(-1), counts, width


def listed_specs(specs, width: int, outer: int = 2, inner: int = 3):
    """``specs`` whose index maps read grid index ``inner`` as the block id listed at that
    position of row ``outer`` (the index maps of a scalar-prefetch grid get the lists after
    the grid indices)."""
    def remap(spec):
        base = spec.index_map

        def index_map(*args):
            *idx, ids, _ = args
            idx[inner] = ids[idx[outer] * width + idx[inner]]
            return base(*idx)
        return spec.replace(index_map=index_map)

    return [remap(s) for s in specs]


def live(refs, sparse: bool, width: int = 1, outer: int = 2, inner: int = 3):
    """``(refs, block, live)`` of a kernel: its own refs (the lists dropped), the innermost
    grid position's block id, and whether it is live (None: dense, every block)."""
    pos = pl.program_id(inner)
    if not sparse:
        return refs, pos, None
    ids, counts, *rest = refs
    row = pl.program_id(outer)
    return tuple(rest), ids[row * width + pos], pos < counts[row]


def when(alive, fn) -> None:
    """``fn()`` on live positions only (every position when ``alive`` is None)."""
    if alive is None:
        fn()
    else:
        pl.when(alive)(fn)


def pallas_call(kernel, *, grid, in_specs, out_specs, scratch_shapes, lists=None, **kw):
    """``pl.pallas_call`` over ``grid``, or, with ``lists = (ids, counts, width)``, over the
    listed grid (innermost axis: ``width`` positions) with the lists scalar-prefetched; the
    returned function takes the kernel's own arguments either way."""
    if lists is None:
        return pl.pallas_call(kernel, grid=grid, in_specs=in_specs, out_specs=out_specs,
                              scratch_shapes=scratch_shapes, **kw)
    import jax.numpy as jnp
    from jax.experimental.pallas import tpu as pltpu

    ids, counts, width = lists
    spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2, grid=tuple(grid[:-1]) + (width,),
        in_specs=listed_specs(in_specs, width), out_specs=listed_specs(out_specs, width),
        scratch_shapes=scratch_shapes)
    call = pl.pallas_call(kernel, grid_spec=spec, **kw)
    return lambda *args: call(jnp.asarray(ids), jnp.asarray(counts), *args)


__all__ = ["block_lists", "listed_specs", "live", "pallas_call", "when"]
