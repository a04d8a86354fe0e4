"""Planning a sequence-parallel attention call: a pure function of shapes, mesh and options.

:func:`plan_sequence_parallel` decides everything before any array is touched — the
``ring × ulysses`` split of the ``context`` axis, padding, the effective flash blocks, the
local kernel and its options, and whether the shard-major kernel path runs (with the reasons
when it does not) — and checks every rule, raising with the value and the fix. The returned
:class:`SequencePlan` is frozen; :func:`ditax.attention.sequence.run_sequence_parallel`
executes it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional

import jax.numpy as jnp
from jax.sharding import Mesh

from ditax.attention import registry
from ditax.attention.blocks import effective_block, round_up
from ditax.attention.config import OUT_A2A_MODES
from ditax.attention.options import pick
from ditax.attention.local import LocalRun
from ditax.attention.sequence.sparse_ring import RingTables
from ditax.intmath import ceil_div
from ditax.parallel.axes import (
    SEQ_AXIS,
    check_batch_divides,
    check_heads_divide,
    head_shards,
)
from ditax.parallel.collectives import ContextGrid, context_grid
from ditax.parallel.platform import Platform, platform_of

SHARD_MAJOR_LOCALS = ("flash", "sage")   # the kernels that read and write the shard-major layout


@dataclass(frozen=True)
class SequencePlan:
    """What a sequence-parallel call will do (see :func:`plan_sequence_parallel`).

    ``ring`` R × ``ulysses`` U = the context size; ``length`` L tokens padded to
    ``padded_length`` = R·U·``shard_length``; ``local`` the kernel with its resolved options
    (for flash / sage the effective ``block_q``/``block_kv``); ``kernel_path``: the shard-major
    kernel path runs (``reasons`` lists why not, each naming the fix); ``cross``: K/V are text
    (``Lk != Lq``) — no exchange, queries sequence-sharded, K/V replicated; ``grid``: the mesh
    (view) and axes the engine runs on; ``ring_tables``: the local kernel's block table
    (``attention.sparsity``) cut into the slices each ring step reads (R > 1).
    """

    backend: str
    mesh: Mesh
    ring: int
    ulysses: int
    length: int
    shard_length: int
    local: LocalRun
    out_a2a: str
    kernel_path: bool
    reasons: tuple[str, ...]
    grid: ContextGrid
    cross: bool = False
    block_q: Optional[int] = None
    block_kv: Optional[int] = None
    interpret: Optional[bool] = None
    ring_tables: Optional[RingTables] = None   # a block table cut per ring step (R > 1)

    @property
    def padded_length(self) -> int:
        return self.ring * self.ulysses * self.shard_length

    def describe(self) -> str:
        """One line for logs: the path taken and why."""
        if self.cross:
            return f"{self.backend} cross-attention: local={self.local.name}, no exchange"
        if self.kernel_path:
            path = f"shard-major {self.local.name} kernel path"
        elif self.ulysses > 1:
            path = f"{self.out_a2a} exchange around local={self.local.name}"
        else:
            path = f"ring around local={self.local.name}"
        why = f" ({self.reasons[0]})" if self.reasons and self.out_a2a != "flat" else ""
        table = "" if self.ring_tables is None else f"; {self.ring_tables.describe()}"
        return (f"{self.backend} out_a2a={self.out_a2a}: {path}{why}; R={self.ring} "
                f"U={self.ulysses}, L={self.length} padded to {self.padded_length}{table}")


def ring_ulysses(backend: str, context: int, options) -> tuple[int, int]:
    """``(R, U)`` for ``backend`` on ``context`` devices (ValueError for a bad
    ``ulysses_shards``)."""
    if backend == "ulysses":
        return 1, context
    if backend == "ring":
        return context, 1
    shards = getattr(options, "ulysses_shards", 0)
    u = context if shards in (0, None) else int(shards)
    if u <= 0 or context % u:
        raise ValueError(f"ulysses_ring: ulysses_shards={shards} does not divide "
                         f"mesh.context={context}; choose a divisor of {context}")
    return context // u, u


def _check_options(backend: str, o) -> None:
    if o.out_a2a not in OUT_A2A_MODES:
        raise ValueError(f"unknown out_a2a={o.out_a2a!r}; choose one of "
                         f"{', '.join(OUT_A2A_MODES)}")
    if backend == "ring" and o.out_a2a != "flat":
        raise ValueError(f"ring: out_a2a={o.out_a2a!r} has no meaning for pure ring attention "
                         f"(K/V rotate, there is no Ulysses all-to-all to lay out); use "
                         f"out_a2a='flat', or backend='ulysses'/'ulysses_ring' for the "
                         f"{OUT_A2A_MODES[1:]} modes")


def _context(mesh) -> int:
    if mesh is None:
        raise ValueError("sequence-parallel attention needs mesh=...; build one with "
                         f"ditax.parallel.make_mesh({{{SEQ_AXIS!r}: n}})")
    if SEQ_AXIS not in mesh.shape:
        raise ValueError(f"mesh axes {tuple(mesh.shape)} have no {SEQ_AXIS!r} axis; build the "
                         f"mesh with ditax.parallel.make_mesh")
    return mesh.shape[SEQ_AXIS]


def _local_entry(name: str) -> registry.Backend:
    entry = registry.get(name)
    if entry.kind != "local":
        raise ValueError(f"local={name!r} is itself a parallel backend; choose a local kernel "
                         f"(reference, xla, blockwise, splash, flash)")
    return entry


def _shard_major_reasons(local: str, head_dim, bq, bkv, dtype, platform, interpret, ring):
    if local == "sage":
        from ditax.attention.sage import check_shard_major_supported as sage_supported

        return sage_supported(bq, bkv, dtype, ring, platform, interpret)
    from ditax.attention.flash import check_shard_major_supported

    reasons = []
    if local not in SHARD_MAJOR_LOCALS:
        reasons.append(f"local={local!r}: the shard-major path needs local='flash' or 'sage' "
                       f"(the kernels that read q and write their output shard-major); set "
                       f"local='flash' or use out_a2a='chunked'/'flat'")
    return reasons + check_shard_major_supported(head_dim, bq, bkv, dtype, platform, interpret)


def plan_sequence_parallel(backend: str, mesh, *, q_shape, kv_len: Optional[int] = None,
                           dtype=jnp.float32, options=None,
                           platform: Optional[Platform] = None) -> SequencePlan:
    """Plan ``backend`` (ulysses | ring | ulysses_ring) for q ``[B, L, N, K]`` and ``kv_len``
    keys (default L; another length is cross-attention) on ``mesh``.

    ``options``: the backend's options — its class (``SequenceOptions`` or
    ``UlyssesRingOptions``, :mod:`ditax.attention.options`) or a dict of ``attend`` keyword options (default: defaults);
    ``platform``: the target (default :func:`~ditax.parallel.platform.platform_of` of the
    mesh). Raises ValueError for every rule the call breaks (TypeError for unknown options).
    """
    entry = registry.get(backend)
    if entry.kind != "sequence":
        raise ValueError(f"{backend!r} is not a sequence-parallel backend; choose one of "
                         f"ulysses, ring, ulysses_ring")
    o = options if options is not None else {}
    if isinstance(o, dict):
        o = registry.backend_options(backend, o)
    _check_options(backend, o)
    context = _context(mesh)
    R, U = ring_ulysses(backend, context, o)
    platform = platform or platform_of(mesh)
    o = entry.resolve(o, platform)
    entry = _local_entry(o.local)
    B, L, N, K = q_shape
    cross = kv_len is not None and kv_len != L
    if cross:
        if o.out_a2a == "shard_major":
            raise ValueError(f"{backend}: out_a2a='shard_major' cannot run for cross-attention "
                             f"(Lq={L} != Lk={kv_len}): text K/V are replicated and there is "
                             f"no Ulysses exchange; use out_a2a='flat' or 'chunked'")
        check_heads_divide(N, mesh, "cross attention")
        values = dict(o.local_options, block_q=o.block_q, block_kv=o.block_kv,
                      interpret=o.interpret)
        local = LocalRun(entry, _local_options(entry, values))
        return SequencePlan(backend, mesh, 1, 1, L, L, local, o.out_a2a, False, (),
                            context_grid(mesh, 1, 1), cross=True, interpret=o.interpret)

    check_heads_divide(N, mesh, backend)
    heads = N // head_shards(mesh)
    if heads % U:
        raise ValueError(
            f"{backend}: {heads} heads per tensor shard are not divisible by the {U} Ulysses "
            f"shards; use backend='ulysses_ring' with ulysses_shards dividing {heads}, "
            f"backend='ring', or a mesh with a different context size")
    check_batch_divides(B, mesh, f"{backend}: batch")
    if R > 1:
        entry = registry.ring_kernel(entry, backend)      # cudnn / te: blockwise, said once

    # Shard length Lc; on flash / sage, the effective blocks and Lc a block multiple,
    # identical for every out_a2a mode so the modes compute bit-identical values (sage: the
    # same quantization blocks, means and scales).
    Lc = ceil_div(L, R * U)
    bq = bkv = None
    if entry.name == "flash":
        bq, bkv = _flash_blocks(o, Lc, platform)
    elif entry.name == "sage":
        from ditax.attention.sage import sage_blocks

        bq, bkv = sage_blocks(o.block_q, o.block_kv, Lc)
    if bq is not None:
        Lc = round_up(Lc, math.lcm(bq, bkv))

    reasons: list[str] = []
    table = dict(o.local_options).get("block_table")
    if o.out_a2a != "flat":
        reasons = _shard_major_reasons(entry.name, K, bq or o.block_q or 128,
                                       bkv or o.block_kv or 128,
                                       dtype, platform, o.interpret, R)
        if table is not None:
            reasons.append("a block table (attention.sparsity) runs on the exchange path")
        if o.out_a2a == "shard_major" and reasons:
            raise ValueError(f"{backend}: out_a2a='shard_major' cannot run: "
                             + "; ".join(reasons))
    ring_tables = _ring_tables(backend, table, L, R, U, Lc)
    kernel_path = o.out_a2a == "shard_major" or (o.out_a2a == "chunked" and U > 1
                                                 and not reasons)
    values = dict(o.local_options, block_q=bq or o.block_q, block_kv=bkv or o.block_kv,
                  interpret=o.interpret)
    local = LocalRun(entry, _local_options(entry, values), need_lse=R > 1)
    return SequencePlan(backend, mesh, R, U, L, Lc, local, o.out_a2a, kernel_path,
                        tuple(reasons), context_grid(mesh, R, U), block_q=bq, block_kv=bkv,
                        interpret=o.interpret, ring_tables=ring_tables)


def _ring_tables(backend: str, table, L: int, R: int, U: int, Lc: int):
    """A block table's slices for the ring steps (None without a table or a ring), after
    checking that each of the ``R·U`` context shards holds whole tiles, unpadded: the table's
    token ids are then the exchanged group's own (Ulysses) and cut at group bounds (ring)."""
    if table is None:
        return None
    n, shards = table.tiles, R * U
    if L != n * table.tile_len or n % shards or Lc * shards != L:
        raise ValueError(
            f"{backend}: a block table of {n} tiles of {table.tile_len} tokens needs "
            f"{n * table.tile_len} tokens (has {L}) in whole tiles on each of the {shards} "
            f"context shards, unpadded (shards of {Lc}); use a tile count that is a multiple "
            f"of {shards} and blocks that divide the tile")
    return RingTables.of(table, R) if R > 1 else None


def _local_options(entry: registry.Backend, values: dict):
    """The local kernel's options from ``values``: its caller-set ones (:func:`pick`) and the
    internal ones a model set on the sequence call's ``local_options`` (a sparse layout's
    block table), which :func:`pick` leaves out."""
    picked = pick(entry.options, values)
    inner = {k: v for k, v in values.items()
             if k not in entry.options.names() and k in entry.options.__dataclass_fields__}
    return replace(picked, **inner) if inner else picked


def _flash_blocks(o, Lc: int, platform: Platform) -> tuple[int, int]:
    """The shard-major flash blocks for shards of ``Lc`` tokens: the options' (the configured
    ones), unset ones compiled on a TPU the table's query block (:mod:`ditax.attention.tuning`)
    for both — the shards are padded to a multiple of both blocks, so they share one —, else
    128; clipped to the shard (:func:`effective_block`)."""
    from ditax.attention.options import FlashOptions
    from ditax.attention.tuning import flash_blocks

    bq, bkv = o.block_q, o.block_kv
    if bq is None or bkv is None:
        if platform.name == "tpu" and not o.interpret:
            b = flash_blocks(Lc, Lc, platform.device_kind)[0]
            bq, bkv = bq or bkv or b, bkv or bq or b
        else:
            bq, bkv = bq or FlashOptions.DEFAULT, bkv or FlashOptions.DEFAULT
    return effective_block(bq, Lc), effective_block(bkv, Lc)


__all__ = ["SequencePlan", "plan_sequence_parallel", "ring_ulysses", "SHARD_MAJOR_LOCALS"]
