"""A model's block-sparse self-attention (``attention.sparsity``): the tile-major layout of its
video tokens and the block table its self-attention call reads.

A video DiT with ``sparsity != "none"`` asks :func:`sparse_layout` for the layout of its
patched latent grid ``(F, Y, X)`` (built once per config and grid: the numpy tables and the
hashable :class:`~ditax.attention.sparse.masks.BlockTable` are cached, so each traced shape
gets the same static kernel), then

- permutes its frame-major tokens, their RoPE tables and any per-token terms into tile-major
  order once, before the blocks (:meth:`SparseLayout.to_tiles`; a grid that is no multiple
  of the tile is padded, the padding zero);
- masks the padding as keys (:meth:`SparseLayout.kv_mask`: every tile holds at least one
  real token, so no query row is left without a key);
- runs self-attention through :meth:`SparseLayout.plan` (the splash or flash call with the
  block table: whole masked blocks skipped);
- takes the tokens back to frame-major order after the blocks (:meth:`SparseLayout.
  from_tiles`, the padding rows dropped). Both permutations are gathers: exact.

Cross-attention (text / image keys) is untouched: its queries may be in any order.
``full`` keeps every block (the dense model's values, the layout's cost only);
``sliding_tile`` keeps the key tiles within ``(window - 1) / 2`` tiles of the query tile along
each axis (``window``: the odd span in tiles; near the grid's edges the window is cut, not
shifted inward; the window is in tiles, so its reach in tokens is ``window`` times the tile:
``3, 3, 3`` spans 12 x 24 x 24 tokens in 4 x 8 x 8 tiles, 9 x 96 x 12 in 3 x 32 x 4 ones);
``radial`` keeps the tiles of radial attention's rule (``decay``: the scale of
its shrinking windows, :func:`~ditax.attention.sparse.masks.radial_blocks`); ``vsa`` has no
table: its self-attention is :class:`~ditax.attention.sparse.vsa.VsaCall` (a coarse pooled
pass picks ``topk`` key tiles per query tile and input; the attention layer adds its gate).

Under sequence parallelism (``shards`` context shards) whole masked tile-frames are appended
until the tile count divides the shards (:func:`shard_frames`: each shard then holds whole
tiles; a padding tile attends only itself, one block of work).

``attention.tile=auto`` lays each grid out in the tile that pads it least (:func:`layout_tile`,
:func:`~ditax.attention.sparse.tiles.least_padding_tile`: 128·k tokens, at most 1024), said in
one info line per grid. ``window`` and ``topk`` stay counts of tiles: with another tile they
cover another share of the grid (``topk / tiles`` is VSA's density).
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass, replace

import numpy as np

from ditax.attention.blocks import LANES, SUBLANE
from ditax.attention.registry import SEQUENCE_BACKENDS
from ditax.attention.sparse.masks import BlockTable, block_mask, without_empty_tiles
from ditax.attention.sparse.tiles import (DEFAULT, MOST, TileOrder, least_padding_tile,
                                          padded_length, padding_note)
from ditax.errors import ConfigError
from ditax.intmath import ceil_div

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SparseLayout:
    """The tile-major order of one token grid and its block table (module docstring)."""

    order: TileOrder
    table: BlockTable | None          # None under vsa (its tiles are picked per input)
    sparsity: str
    topk: int = 0                     # vsa: key tiles a query tile attends
    fine: str = "gather"              # vsa: attention.vsa_fine (gather | table)
    group: int = 0                    # vsa, table: attention.vsa_group (0: per shape)

    def to_tiles(self, x, axis: int = 1):
        """``x`` with its frame-major token axis in tile-major order (padding zero)."""
        return self.order.to_tiles(x, axis)

    def from_tiles(self, y, axis: int = 1):
        """The inverse of :meth:`to_tiles` (padding dropped)."""
        return self.order.from_tiles(y, axis)

    def kv_mask(self, batch: int):
        """``[batch, L']`` bool, False at the padding keys; None when the grid needs none."""
        import jax.numpy as jnp

        valid = self.order.valid
        return None if valid.all() else jnp.broadcast_to(jnp.asarray(valid),
                                                         (batch, valid.size))

    def call(self, call):
        """The :class:`~ditax.attention.AttentionCall` ``call`` (splash or flash) with this
        layout's block table; query / key blocks unset in the config become one tile each
        where a tile is a multiple of the kernel's tiling (splash: 128 lanes, flash: 8
        sublanes; each kernel block then kept or skipped whole; flash's blocks must lie
        inside a tile, :mod:`ditax.attention.kernels.flash_sparse`)."""
        if self.sparsity == "vsa" and call.backend == "ulysses":
            return self._ulysses_vsa(call)
        if self.sparsity == "vsa":
            from ditax.attention.sparse.vsa import VsaCall

            flash = call.backend == "flash"
            if self.fine == "table":
                return VsaCall(self.order.tile_len, self.topk, self._table(call))
            tensor = call.mesh.shape.get("tensor", 1) if call.mesh is not None else 1
            if flash and tensor > 1 and not self.order.valid.all():
                raise ConfigError(
                    f"attention.sparsity=vsa with attention.backend=flash on a "
                    f"{'x'.join(map(str, self.order.grid))} grid that is no multiple of "
                    f"attention.tile={','.join(map(str, self.order.tile))} runs one head a "
                    f"kernel row (each head's padded tiles masked apart), so it needs "
                    f"mesh.tensor=1 (is {tensor}); use a tile dividing the grid, "
                    f"attention.backend=xla or mesh.tensor=1")
            return VsaCall(self.order.tile_len, self.topk, call if flash else None)
        if call.backend in SEQUENCE_BACKENDS:      # whole tiles a context shard
            return self._sequence(call)
        if call.backend not in ("splash", "flash"):
            raise ConfigError(f"attention.sparsity={self.sparsity} needs attention.backend="
                              f"splash or flash, or ulysses, ring or ulysses_ring around one "
                              f"(whole tiles a context shard); self-attention runs "
                              f"{call.backend}")
        return replace(call, options=replace(call.options, block_table=self.table,
                                             **self._blocks(call.backend, call.options)))

    def _blocks(self, kernel: str, options) -> dict:
        """The query / key blocks unset in ``options`` as one tile each, where a tile is a
        multiple of ``kernel``'s tiling (splash: 128 lanes, flash: 8 sublanes)."""
        t = self.order.tile_len
        unit = LANES if kernel == "splash" else SUBLANE
        return {k: t for k in ("block_q", "block_kv")
                if getattr(options, k) is None and t % unit == 0}

    def _sequence(self, call):
        """Ulysses, ring or ulysses_ring around a splash or flash local kernel: each context
        shard holds whole tiles (the tile count a multiple of the shards). After Ulysses'
        exchange every device holds its ring group's tiles for its heads; the local kernel
        reads the block table unchanged (one group) or, on a ring, each step the table's
        slice of (own group, visiting group) (:mod:`ditax.attention.sequence.sparse_ring`).
        The exchange path: the shard-major kernel path takes no table."""
        o = call.options
        shards = call.mesh.shape.get("context", 1) if call.mesh is not None else 1
        n = int(np.prod(self.order.tiles))
        if o.local not in ("splash", "flash"):
            raise ConfigError(f"attention.sparsity={self.sparsity} with backend={call.backend} "
                              f"needs attention.local=splash or flash (the kernels that read "
                              f"a block table); local is {o.local}")
        if n % shards:
            raise ConfigError(
                f"attention.sparsity={self.sparsity} on mesh.context={shards}: the "
                f"{'x'.join(map(str, self.order.grid))} grid lies in {n} tiles of "
                f"{','.join(map(str, self.order.tile))}, not a multiple of the {shards} "
                f"context shards (each shard must hold whole tiles); lay the tokens out for "
                f"the shards (sparse_layout(acfg, grid, shards={shards}) pads whole masked "
                f"tiles, as the Wan models do), or choose a tile whose count divides")
        if o.out_a2a == "shard_major":
            raise ConfigError(f"attention.sparsity={self.sparsity} runs Ulysses on its exchange "
                              f"path (the shard-major kernel path takes no block table); use "
                              f"attention.out_a2a=flat or chunked")
        local = dict(o.local_options, block_table=self.table)
        return replace(call, options=replace(o, local_options=tuple(sorted(
            local.items(), key=lambda kv: kv[0])), **self._blocks(o.local, o)))

    def _ulysses_vsa(self, call):
        """VSA under Ulysses (:mod:`~ditax.attention.sparse.vsa_ulysses`): the whole of VSA per
        device on its heads, its fine stage on the local kernel (xla: jnp, flash: gathered
        tiles or, ``vsa_fine=table``, the table kernels), unsharded inside ``shard_map``."""
        from ditax.attention.plan import AttentionCall
        from ditax.attention.sparse.vsa import VsaCall
        from ditax.attention.sparse.vsa_ulysses import UlyssesVsa
        from ditax.parallel.platform import platform_of
        from ditax.parallel.sharding import ShardingContext

        if call.mesh is None or "context" not in call.mesh.shape:
            raise ConfigError("attention.sparsity=vsa with backend=ulysses needs a mesh with a "
                              "context axis; build the model with mesh=ditax.parallel."
                              "make_mesh({'context': n}), or use backend=xla or flash")
        shards = call.mesh.shape["context"]
        if call.options.local not in ("xla", "flash"):
            raise ConfigError(f"attention.sparsity=vsa with backend=ulysses needs "
                              f"attention.local=xla or flash (VSA's fine stage); local is "
                              f"{call.options.local}")
        if self.order.length % shards:
            raise ConfigError(
                f"attention.sparsity=vsa on mesh.context={shards}: the "
                f"{'x'.join(map(str, self.order.grid))} grid lies in {self.order.length} "
                f"tile-major tokens, which do not split over the {shards} context shards; "
                f"choose attention.tile or mesh.context so that they do")
        name, options = call.local()
        local = AttentionCall(name, options, ShardingContext(),
                              call.platform or platform_of(call.mesh))
        inner = (self._table(local) if self.fine == "table"
                 else local if name == "flash" else None)
        return UlyssesVsa(VsaCall(self.order.tile_len, self.topk, inner), call.mesh)

    def _table(self, call):
        """vsa's fine pass on the table kernels (``vsa_fine=table``; flash only)."""
        from ditax.attention.sparse.vsa_table import TableFine, table_reasons

        if call.backend != "flash":
            raise ConfigError(f"attention.vsa_fine=table runs on ditax's Pallas table kernels, "
                              f"chosen with attention.backend=flash; self-attention runs "
                              f"{call.backend}; set attention.backend=flash or vsa_fine=gather")
        why = table_reasons(self.order.tile_len)
        if why:
            raise ConfigError(why[0])
        return TableFine.of(call, self.group)

    def plan(self, plan):
        """An :class:`~ditax.attention.AttentionPlan` whose self-attention is :meth:`call`'s
        (cross-attention unchanged)."""
        return replace(plan, self_attn=self.call(plan.self_attn))


def sparse_layout(acfg, grid, shards: int = 1) -> SparseLayout | None:
    """The layout of ``grid = (F, Y, X)`` patched latent tokens for the attention config
    ``acfg`` (None when ``acfg.sparsity`` is ``none``). ``shards``: the context shards the
    tokens are split over (sequence parallelism); a block table's tiles are padded with whole
    masked tile-frames to a multiple of them (:func:`shard_frames`)."""
    if acfg is None or isinstance(acfg, str) or acfg.sparsity == "none":
        return None
    table = acfg.sparsity == "vsa" and getattr(acfg, "vsa_fine", "gather") == "table"
    return _layout(acfg.sparsity, layout_tile(acfg.tile, grid, TABLE_MOST if table else MOST),
                   tuple(int(n) for n in acfg.window), float(acfg.decay),
                   tuple(int(n) for n in grid), int(getattr(acfg, "topk", 0)),
                   str(getattr(acfg, "vsa_fine", "gather")), int(getattr(acfg, "vsa_group", 0)),
                   int(shards))


def shard_frames(order: TileOrder, shards: int) -> TileOrder:
    """``order`` with as few whole padding tile-frames appended as make its tile count a
    multiple of ``shards`` (each context shard then holds whole tiles; the padding is masked
    as keys, dropped as queries, and each padding tile costs one block:
    :func:`~ditax.attention.sparse.masks.without_empty_tiles`); said once in an info line."""
    nt, nh, nw = order.tiles
    step = shards // math.gcd(shards, nh * nw)
    frames = ceil_div(nt, step) * step
    if frames == nt:
        return order
    padded = replace(order, frames=frames)
    log.info("attention.sparsity on %d context shards: %d tiles of %s padded to %d with %d "
             "whole masked tile-frames (%s tokens for %s)", shards, nt * nh * nw,
             "x".join(map(str, order.tile)), frames * nh * nw, frames - nt,
             f"{padded.length:,}", f"{order.length:,}")
    return padded


#: the largest tile ``auto`` gives VSA's table kernels: a step holds ``[t, t]`` float32
#: scores, and past 512 tokens not one key tile a step fits v5e's 16 MiB of scoped VMEM
#: (:func:`~ditax.attention.kernels.vsa_table.vmem_estimate`)
TABLE_MOST = 512


def layout_tile(tile, grid, most: int = MOST) -> tuple[int, int, int]:
    """``attention.tile`` for ``grid = (F, Y, X)``: as given, or under ``auto`` the tile of at
    most ``most`` tokens that pads the grid least (:func:`~ditax.attention.sparse.tiles.
    least_padding_tile`; said once per grid in an info line, with the padding of the default
    ``4 x 8 x 8`` beside it)."""
    grid = tuple(int(n) for n in grid)
    return _auto_tile(grid, most) if tile == "auto" else tuple(int(n) for n in tile)


@functools.lru_cache(maxsize=32)
def _auto_tile(grid: tuple, most: int) -> tuple[int, int, int]:
    tile, default = least_padding_tile(grid, most=most), DEFAULT
    log.info("attention.tile=auto: %s (the default %s: %s tokens)", padding_note(grid, tile),
             "x".join(map(str, default)), f"{padded_length(grid, default):,}")
    return tile


@functools.lru_cache(maxsize=32)
def _layout(sparsity: str, tile: tuple, window: tuple, decay: float, grid: tuple,
            topk: int = 0, fine: str = "gather", group: int = 0, shards: int = 1
            ) -> SparseLayout:
    order = TileOrder(grid, tile)
    if sparsity == "vsa":
        tiles = int(np.prod(order.tiles))
        if topk > tiles:
            raise ConfigError(f"attention.topk={topk} exceeds the {tiles} tiles of the "
                              f"{'x'.join(map(str, grid))} token grid (attention.tile="
                              f"{','.join(map(str, tile))}); use attention.topk<={tiles} or "
                              f"a smaller attention.tile")
        return SparseLayout(order, None, sparsity, topk, fine, group)
    order = shard_frames(order, shards)
    half = tuple((w - 1) // 2 for w in window)
    blocks = without_empty_tiles(order, block_mask(order, sparsity, half, decay))
    return SparseLayout(order, BlockTable.of(order, blocks), sparsity)


def layout_summary(acfg, grid, shards: int = 1) -> dict | None:
    """What ``acfg``'s sparsity lays out for ``grid = (F, Y, X)`` tokens on ``shards``
    context shards (None without one): ``tile`` (``auto`` resolved; ``tile_auto`` says so),
    ``tokens`` (the grid's) and ``padded_tokens`` (tile-major, whole padding tiles for the
    shards included), ``padding`` (their excess share), ``density`` (of the scores computed)
    — ``ditax plan``'s ``sparsity`` entry."""
    layout = sparse_layout(acfg, grid, shards)
    if layout is None:
        return None
    order = layout.order
    n = int(np.prod(order.grid))
    return {"mode": layout.sparsity, "grid": list(order.grid), "tile": list(order.tile),
            "tile_auto": acfg.tile == "auto", "tile_len": order.tile_len, "tokens": n,
            "padded_tokens": order.length, "padding": order.length / n - 1,
            "density": attention_density(acfg, grid, shards)}


def latent_layout_summary(acfg, model_cfg, latent, shards: int = 1) -> dict | None:
    """:func:`layout_summary` of the token grid a video latent ``[..., F, H, W]`` makes through
    ``model_cfg.patch_size`` (None for a model without a 3-axis patch, or no sparsity): what
    ``ditax plan`` and ``ditax bench`` report of the forward they run."""
    patch = getattr(model_cfg, "patch_size", None)
    if not isinstance(patch, (tuple, list)) or len(patch) != 3 or len(latent) < 3:
        return None
    return layout_summary(acfg, [int(n) // p for n, p in zip(tuple(latent)[-3:], patch)],
                          shards)


def attention_density(acfg, grid, shards: int = 1) -> float:
    """The share of the self-attention scores ``acfg``'s sparsity computes on a ``grid = (F, Y,
    X)`` of tokens: its block table's density (1 without a sparsity; on ``shards`` context
    shards the table with their padding tiles, of its padded length). What a FLOP count
    multiplies the dense ``4 L² D`` of the scores and values by (``ditax plan``)."""
    from ditax.attention.sparse.masks import density

    layout = sparse_layout(acfg, grid, shards)
    if layout is not None and layout.sparsity == "vsa":
        from ditax.attention.sparse.vsa import vsa_density

        order = layout.order
        return vsa_density(int(np.prod(order.tiles)), order.tile_len, layout.topk)
    return 1.0 if layout is None else density(layout.table.table)


def reference_mask(layout: SparseLayout) -> np.ndarray:
    """``[L', L']`` token mask of the layout (tile-major; padding keys never attended): what
    a dense reference applies (tests, small grids only)."""
    from ditax.attention.sparse.masks import element_mask

    return element_mask(layout.order, layout.table.table)


__all__ = ["SparseLayout", "TABLE_MOST", "attention_density", "latent_layout_summary",
           "layout_summary", "layout_tile", "shard_frames", "sparse_layout", "reference_mask"]
