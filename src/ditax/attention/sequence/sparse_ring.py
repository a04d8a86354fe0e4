"""A ring (``ring`` / ``ulysses_ring`` with R > 1) over a block table (``attention.sparsity``).

The tokens are tile-major and each of the R ring groups holds whole tiles (its ``U`` context
shards, gathered by the Ulysses exchange where U > 1), so the ``[tiles, tiles]`` table cuts
into R x R square slices: slice ``(r, j)`` is what group ``r``'s queries see of group ``j``'s
keys, in the local token ids of both (:class:`RingTables`, built once per plan, numpy). As
the K/V chunks rotate, each ring step runs the local kernel with the slice of (this device's
ring group, the visiting chunk's group) — a ``lax.switch`` over the distinct slices, the
visiting group a traced index (:func:`~ditax.attention.sequence.merge.ring_loop` with
``source``) — so the kernel skips the blocks that slice masks; a step whose slice masks
every block runs no kernel: the online-softmax state passes on unchanged (flash, which
continues from it) or the step is an empty partial (zeros, log-sum-exp -inf) that the
log-sum-exp merge weighs by zero. Exact either way: the same keys and scores as one device.

A query row that sees no key of a live slice (its tile's row of the slice empty) is an empty
partial too: flash keeps the carried state for it; splash writes NaN there with a -inf
log-sum-exp, which :func:`sparse_ring_step` zeroes before the merge.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import jax
import jax.numpy as jnp
import numpy as np

from ditax.attention.sparse.masks import BlockTable


@dataclass(frozen=True)
class RingTables:
    """A block table cut for a ring of ``ring`` groups: ``tables`` the distinct slices that
    keep a block, ``index[r][j]`` the slice of (query group ``r``, key group ``j``) in
    ``tables`` or -1 where it keeps none."""

    tables: tuple
    index: tuple

    @classmethod
    def of(cls, table: BlockTable, ring: int) -> "RingTables":
        n = table.tiles
        if n % ring:
            raise ValueError(f"a block table of {n} tiles cannot be cut into {ring} ring groups "
                             f"of whole tiles; use a tile count that is a multiple of {ring}")
        g, full = n // ring, table.table
        tables: list[BlockTable] = []
        index = []
        for r in range(ring):
            row = []
            for j in range(ring):
                part = full[r * g:(r + 1) * g, j * g:(j + 1) * g]
                if not part.any():
                    row.append(-1)
                    continue
                sliced = BlockTable(table.tile_len, g, np.packbits(part).tobytes())
                if sliced not in tables:
                    tables.append(sliced)
                row.append(tables.index(sliced))
            index.append(tuple(row))
        return cls(tuple(tables), tuple(index))

    @property
    def skipped(self) -> int:
        """The (query group, key group) steps that run no kernel."""
        return sum(i < 0 for row in self.index for i in row)

    def describe(self) -> str:
        r = len(self.index)
        return (f"block table in {len(self.tables)} distinct slices, {self.skipped} of "
                f"{r * r} ring steps skip the kernel")


def sparse_ring_step(step, local, tables: RingTables, ring_axis: str, carries: bool):
    """``step(run, q, kv, prev)`` (one ring step on the :class:`~ditax.attention.local.
    LocalRun` ``run``) as a :func:`ring_loop` step with ``source``: ``local`` with the slice
    of (this device's ring group, the visiting group ``src``) as its block table, or no
    kernel where the slice masks everything (``carries``: ``prev`` passes on; otherwise an
    empty partial shaped like a live step's)."""
    runs = [replace(local, options=replace(local.options, block_table=t))
            for t in tables.tables]
    index = np.asarray(tables.index, np.int32) + 1          # branch 0: no block kept

    def live(run, q, kv, prev):
        out = step(run, q, kv, prev)
        if carries:
            return out
        o, lse = out       # a row that saw no key: NaN (splash) with lse -inf -> zeros
        return jnp.where(jnp.isfinite(lse)[..., None], o, jnp.zeros((), o.dtype)), lse

    def ring_step(q, kv, prev, src):
        branches = [functools.partial(live, run, q, kv, prev) for run in runs]
        if carries:
            empty = lambda: prev        # noqa: E731
        else:
            shapes = jax.eval_shape(branches[0])
            empty = lambda: (jnp.zeros(shapes[0].shape, shapes[0].dtype),   # noqa: E731
                             jnp.full(shapes[1].shape, -jnp.inf, shapes[1].dtype))
        if not tables.skipped and len(runs) == 1:
            return branches[0]()
        which = jnp.asarray(index)[jax.lax.axis_index(ring_axis), src]
        return jax.lax.switch(which, [empty] + branches)

    return ring_step


__all__ = ["RingTables", "sparse_ring_step"]
