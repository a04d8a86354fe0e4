"""VSA's fine pass on the table kernels (``attention.sparsity=vsa attention.backend=flash
attention.vsa_fine=table``): each (sample, head, query tile) visits its ``topk`` picked key
tiles where they lie in K / V, the picks scalar-prefetched
(:mod:`ditax.attention.kernels.vsa_table`), instead of gathering ``topk`` copies of K / V
(:func:`ditax.attention.sparse.vsa.fine_call`). Each grid step takes ``group`` picked key
tiles (``attention.vsa_group``; 0: :func:`~ditax.attention.kernels.vsa_table.group_for`
chooses from the shape; 1: one tile a step, the first version's kernels).

:func:`fine_table` is the differentiable fine stage, token-major ``[B, L, N, K]`` in,
``[B, L, N, K]`` float32 out, the same values as :func:`ditax.attention.sparse.vsa.fine`.
Its gradient (``jax.custom_vjp``) is all Pallas: a dq kernel over the same table and a dk/dv
kernel over the transposed table, built with jnp from the picks (sort and scans, on the
device: :func:`~ditax.attention.kernels.vsa_table_dkv.inverse_table`). The picks take no
gradient (an index).

Where it runs: compiled on TPU, interpreted on CPU (tests), refused elsewhere, as the flash
kernel (the registry's ``flash`` entry decides); tiles of a multiple of 8 tokens (one kernel
block is one tile: TPU sublane tiling), float32 / bfloat16 / float16. Each call's table is
bounded by SMEM (:data:`~ditax.attention.kernels.vsa_table.SMEM_WORDS`): the heads run in as
many calls as that takes, and where one head's table is too large, its query tiles do
(:func:`split`). On a mesh it runs under ``shard_map``, batch over the batch axes and
heads over ``tensor`` (the picks split with them; the sequence whole, as VSA needs).
With ``K`` a multiple of 128 the kernels read ``[B, L, N·K]`` where the projections left it
(a head a column block: no copies); otherwise they run head-major, the transposes ``[B, L, N,
K] ↔ [B, N, L, K]`` of q, k, v and o their cost beside the kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import jax
import jax.numpy as jnp

from ditax.attention.blocks import LANES, SUBLANE
from ditax.attention.kernels.vsa_table import (SMEM_WORDS, resolve_group, table_dq,
                                               table_forward)
from ditax.attention.kernels.vsa_table_dkv import inverse_table, table_dkv
from ditax.attention.kernels.vsa_variant import PLAIN, TableVariant

DTYPES = ("float32", "bfloat16", "float16")


def table_reasons(tile_len: int, dtype=None) -> list[str]:
    """Why the table kernels cannot take tiles of ``tile_len`` tokens in ``dtype`` (empty:
    they can); each names the value and the fix."""
    reasons = []
    if tile_len % SUBLANE:
        reasons.append(f"attention.vsa_fine=table: a {tile_len}-token tile is one kernel block "
                       f"and must be a multiple of {SUBLANE} tokens (TPU sublane tiling); use "
                       f"attention.tile of {SUBLANE}·k tokens (e.g. 4,8,8) or vsa_fine=gather")
    if dtype is not None and jnp.dtype(dtype).name not in DTYPES:
        reasons.append(f"attention.vsa_fine=table: dtype {jnp.dtype(dtype).name} is not one of "
                       f"{', '.join(DTYPES)}; cast q/k/v or use vsa_fine=gather")
    return reasons


def _core_plain(q, k, v, keep, picks, scale, interpret, group, variant):
    return table_forward(q, k, v, keep, picks, scale=scale, interpret=interpret,
                         group=group, variant=variant)[0]


def _core_fwd(q, k, v, keep, picks, scale, interpret, group, variant):
    o, lse = table_forward(q, k, v, keep, picks, scale=scale, interpret=interpret, group=group,
                           variant=variant)
    return o, (q, k, v, keep, picks, o, lse)


def _core_bwd(scale, interpret, group, variant, res, do):
    q, k, v, keep, picks, o, lse = res
    dq, delta = table_dq(q, k, v, keep, picks, do, o, lse, scale=scale, interpret=interpret,
                         group=group)
    t = lse.shape[-1]
    key_tiles = (k.shape[1] if k.ndim == 3 else k.shape[2]) // t
    dk, dv = table_dkv(q, k, v, keep, inverse_table(picks, key_tiles, group), do, lse, delta,
                       scale=scale, interpret=interpret)
    return dq, dk, dv, None, None


_core = jax.custom_vjp(_core_plain, nondiff_argnums=(5, 6, 7, 8))
_core.defvjp(_core_fwd, _core_bwd)


def split(b: int, n: int, tiles: int, topk: int, group: int = 1) -> tuple[int, int]:
    """``(heads, query tiles)`` one call takes so its tables fit :data:`SMEM_WORDS`: the
    forward's ``b · heads · query tiles · steps · group`` words (``topk`` padded to whole
    groups) and the dk/dv one's ``b · heads · group · (query tiles · topk // group + tiles)``
    (at ``group = 1`` the larger: ``query tiles · topk + tiles``): all the query tiles and as
    many heads as fit, else one head and as many query tiles as fit (each such call's dk / dv
    its share, summed by autodiff); ValueError when not one query tile fits."""
    width = -(-topk // group) * group

    def words(rows: int) -> int:
        return b * max(rows * width, group * (rows * topk // group + tiles))

    per_head = words(tiles)
    if per_head <= SMEM_WORDS:
        return max(1, min(n, SMEM_WORDS // per_head)), tiles
    rows = min(SMEM_WORDS // b // width, (SMEM_WORDS // b - tiles * group) // topk)
    if rows < 1:
        raise ValueError(f"attention.vsa_fine=table: one query tile's table ({b} samples x "
                         f"({topk} picks + {tiles} key tiles)) exceeds the {SMEM_WORDS}-word "
                         f"SMEM budget; use a larger attention.tile, a smaller batch or "
                         f"vsa_fine=gather")
    return 1, rows


def _local(q, k, v, picks, kv_mask, tile_len: int, scale: float, interpret: bool,
           group: int = 1, packed: bool | None = None, variant=PLAIN):
    """One device's fine pass, ``group`` key tiles a grid step; ``packed`` (None: when ``K %
    128 == 0``) reads ``[B, L, N·K]`` as it is (a head a column block), else the kernels run
    head-major (transposes); ``variant``: the forward kernel's (:mod:`.kernels.vsa_variant`)."""
    b, length, n, kd = q.shape
    nt, topk = length // tile_len, picks.shape[-1]
    packed = kd % LANES == 0 if packed is None else packed
    if packed:
        xs = [x.reshape(b, length, n * kd) for x in (q, k, v)]
        head_axis, tok_axis, width = 2, 1, kd
    else:
        xs = [x.transpose(0, 2, 1, 3) for x in (q, k, v)]               # [B, N, L, K]
        head_axis, tok_axis, width = 1, 2, 1

    def cut(x, axis, start, stop):
        return jax.lax.slice_in_dim(x, start, stop, axis=axis)

    keep = None if kv_mask is None else (
        kv_mask.reshape(b, nt, 1, tile_len).astype(jnp.int32))
    picks = jax.lax.stop_gradient(picks).astype(jnp.int32)
    hs, qs = split(b, n, nt, topk, group)
    groups = []
    for h in range(0, n, hs):
        he = min(n, h + hs)
        q_h, k_h, v_h = (cut(x, head_axis, h * width, he * width) for x in xs)
        rows = [_core(cut(q_h, tok_axis, c * tile_len, min(nt, c + qs) * tile_len), k_h, v_h,
                      keep, picks[:, h:he, c:c + qs], scale, interpret, group, variant)
                for c in range(0, nt, qs)]
        groups.append(rows[0] if len(rows) == 1 else jnp.concatenate(rows, axis=tok_axis))
    o = groups[0] if len(groups) == 1 else jnp.concatenate(groups, axis=head_axis)
    return o.reshape(b, length, n, kd) if packed else o.transpose(0, 2, 1, 3)


def fine_table(q, k, v, picks, tile_len: int, kv_mask=None, scale=None, *, interpret: bool,
               mesh=None, group: int = 0, variant=PLAIN):
    """``[B, L, N, K]`` float32: each query tile's tokens over the tokens of its ``picks
    [B, N, tiles, topk]`` key tiles (padding keys masked by ``kv_mask [B, L]``), on the
    table kernels (module docstring), ``group`` key tiles a grid step (0: chosen from the
    shape, :func:`~ditax.attention.kernels.vsa_table.group_for`; at most ``topk``).
    ``mesh``: run per device under ``shard_map``; ``variant``: the forward kernel's exact
    rewrite (:class:`~ditax.attention.kernels.vsa_variant.TableVariant` or its name, e.g.
    ``"bias+lanes+prescale"``; benchmarks and tests pick one, the default is the plain
    kernel; the backward kernels are the same for every one)."""
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    why = table_reasons(tile_len, q.dtype)
    if why:
        raise ValueError(why[0])
    group = resolve_group(group, picks.shape[-1], tile_len, q.shape[-1], q.dtype.itemsize)
    variant = TableVariant.parse(variant)
    if mesh is None or mesh.size == 1:
        return _local(q, k, v, picks, kv_mask, tile_len, scale, interpret, group,
                      variant=variant)
    from jax.sharding import PartitionSpec as P

    from ditax.parallel.axes import (batch_entry, check_batch_divides, check_heads_divide,
                                     heads_entry)

    check_batch_divides(q.shape[0], mesh, "attention.sparsity=vsa: batch")
    check_heads_divide(q.shape[2], mesh, "attention.sparsity=vsa")
    batch, heads = batch_entry(mesh), heads_entry(mesh)
    tok, pk = P(batch, None, heads, None), P(batch, heads, None, None)

    def body(q, k, v, picks, *m):
        return _local(q, k, v, picks, m[0] if m else None, tile_len, scale, interpret, group,
                      variant=variant)

    args = (q, k, v, picks) + (() if kv_mask is None else (kv_mask,))
    specs = (tok, tok, tok, pk) + (() if kv_mask is None else (P(batch, None),))
    return jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=tok,
                         check_vma=False)(*args)


@dataclass(frozen=True)
class TableFine:
    """What :func:`ditax.attention.sparse.vsa.vsa_attention` runs its fine stage through
    under ``vsa_fine=table`` (``reads_picks``: it takes the picks, not gathered tiles):
    ``interpret`` (None: the platform's default, as flash), the ``mesh``, the target
    ``platform`` (None: the mesh's devices) and ``group`` (``attention.vsa_group``: key tiles
    a grid step, 0: chosen from the shape)."""

    interpret: Optional[bool] = None
    mesh: Any = None
    platform: Any = None
    group: int = 0
    reads_picks: bool = True
    backend: str = "flash"

    @classmethod
    def of(cls, call, group: int = 0) -> "TableFine":
        """The table fine stage of the flash :class:`~ditax.attention.AttentionCall`
        ``call`` (its interpret option, mesh and platform), ``group`` key tiles a step."""
        return cls(getattr(call.options, "interpret", None), call.mesh, call.platform, group)

    def __call__(self, q, k, v, picks, tile_len: int, kv_mask=None, scale=None):
        from ditax.attention.registry import BACKENDS
        from ditax.errors import AttentionUnavailable
        from ditax.parallel.platform import platform_of

        platform = self.platform or platform_of(self.mesh)
        entry = BACKENDS["flash"]
        interpret = (entry.default_interpret(platform) if self.interpret is None
                     else self.interpret)
        why = entry.refusal(platform, interpret=interpret)
        if why is not None:
            raise AttentionUnavailable(f"attention.vsa_fine=table runs the flash kernels' "
                                       f"platforms: {why}")
        return fine_table(q, k, v, picks, tile_len, kv_mask, scale,
                          interpret=bool(interpret), mesh=self.mesh, group=self.group)


__all__ = ["TableFine", "fine_table", "split", "table_reasons"]
