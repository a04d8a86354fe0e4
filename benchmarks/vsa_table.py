"""VSA on a chip (issue 58 item 5): the table fine pass (``attention.vsa_fine=table``, Pallas
kernels reading the picks, :mod:`ditax.attention.sparse.vsa_table`) against dense splash at
Wan 2.1 1.3B's self-attention, densities 12.5 / 50 / 25 % (``topk`` 21 / 84 / 42 of the 168
tiles of 4 x 8 x 8 tokens, in this order), forward and forward + backward, and the table
kernels' groups (``attention.vsa_group``: picked key tiles a grid step) against each other.
One JSON line per case (the sweep's rows, :mod:`tpu_sweep`).

    source benchmarks/tpu_setup.sh
    python benchmarks/vsa_table.py --out $OUT/vsa.jsonl --budget-s 420 [--groups 1,4,8]
    # or as a part of the chip's table: python benchmarks/tpu_chip.py --part vsa ...
    # tiles (issue 58 item 1): 4x8x8 against the least-padding tile at 480p / 720p
    python benchmarks/vsa_table.py --tiles --out $OUT/vsa_tiles.jsonl --budget-s 120
    # (or tpu_chip.py --part vsa_tiles; --tiles --small: a tiny grid, interpreted, on CPU)
    # the table forward's variants (issue 58 item 5) in the least-padding tile, a row each:
    python benchmarks/vsa_table.py --tiles --variants plain,bias+lanes+prescale --out ...

Cases (bf16, ``B = 1``, ``N = 12``, ``K = 128``):

- ``dense splash``: ``attend(backend="splash")`` at the model's 32760 frame-major tokens;
- ``vsa fine table``: the fine pass alone on the 43008 tile-major tokens (the 21 x 30 x 52
  grid padded to whole tiles, padding keys masked), random picks (distinct per query tile),
  first with the group the kernels choose (``group_for``: 8 / 7 / 7 at 50 / 25 / 12.5 %),
  then, at 50 % and 12.5 %, with groups 1 (one tile a step: the first version), 4 and 8;
  each row's ``group`` (``group_auto``: the choice);
- ``vsa layer table``: the whole layer (pooled pass, picks, table fine pass, gate), the
  chosen group;
- ``vsa layer gather-flash`` at 12.5 % only, forward only: the flash-row path, whose gathered
  K / V are ``topk`` times K / V (at 25 % and 50 % they would not fit the chip's 16 GiB).

``flops`` counts the fine pass's ``4 · B · N · L · topk · t · K`` (x 3.5 with the backward),
not the pooled pass. ``--small`` runs a tiny shape interpreted (the code path on CPU; times
mean nothing there).

Measured on one TPU v5e (one group a step, before groups existed): dense splash at 32760
tokens fwd 0.0394 s (167 TFLOP/s, 85 % of 197), fwd+bwd 0.170 s; the fine table pass fwd at
topk 84 / 42 / 21 0.1787 / 0.0913 / 0.0483 s (31.8 / ~31 / 29 TFLOP/s), fwd+bwd 0.476 /
0.2285 / 0.1187 s (~42 TFLOP/s); the whole layer fwd 0.1839 / 0.0967 / 0.0536 s, the
gather-flash layer at 12.5 % 0.0359 s. Linear in topk, ~1.05 µs a grid step where one 256 x
256 x 128 tile pair takes ~0.17 µs at peak: the per-step overhead the groups amortise.
Groups > 1 not yet measured on a chip.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

GRID, TILE, HEADS, HEAD_DIM = (21, 30, 52), (4, 8, 8), 12, 128
DENSITIES = (0.125, 0.5, 0.25)  # the target density first (a budget may cut the tail)
GROUPS = (1, 4, 8)              # compared with the kernels' choice at the SWEPT densities
SWEPT = (0.5, 0.125)


def random_picks(key, b: int, n: int, tiles: int, topk: int):
    """``[b, n, tiles, topk]`` int32: distinct key tiles per query tile, uniformly drawn."""
    return jnp.argsort(jax.random.uniform(key, (b, n, tiles, tiles)), -1)[..., :topk].astype(
        jnp.int32)


def groups_of(topk: int, t: int, head_dim: int, groups=GROUPS) -> list[int]:
    """The groups a density's fine pass runs: the kernels' choice first, then ``groups`` (each
    at most ``topk``), once each."""
    from ditax.attention.kernels.vsa_table import group_for, resolve_group

    out = [group_for(topk, t, head_dim, 2)]
    for g in groups:
        g = resolve_group(g, topk, t, head_dim, 2)
        if g not in out:
            out.append(g)
    return out


def vsa_cases(sw, grid=GRID, tile=TILE, heads=HEADS, head_dim=HEAD_DIM,
              densities=DENSITIES, grad: bool = True, dense: bool = True,
              interpret=None, groups=GROUPS, swept=SWEPT) -> None:
    """The module docstring's cases on ``sw`` (a :class:`tpu_sweep.Sweep`); ``groups`` run at
    the ``swept`` densities besides the chosen one."""
    import numpy as np

    from ditax.attention.sparse.tiles import TileOrder
    from ditax.attention.sparse.vsa import vsa_attention
    from ditax.attention.sparse.vsa_table import TableFine, fine_table
    from tpu_sweep import PEAK, WAN, _gen, attention_cases

    peak = PEAK.get(_gen(), (197e12,))[0]
    if dense:
        shape = (1, int(np.prod(grid)), heads, head_dim)
        attention_cases(sw, WAN if shape == WAN else shape, [("splash", {})], grad=grad)
    order = TileOrder(tuple(grid), tuple(tile))
    t, tiles, L = order.tile_len, int(np.prod(order.tiles)), order.length
    shape = (1, L, heads, head_dim)
    keys = jax.random.split(jax.random.PRNGKey(0), 5)
    q, k, v, g = (jax.random.normal(x, shape, jnp.bfloat16) for x in keys[:4])
    mask = jnp.asarray(order.valid)[None]
    table = TableFine(interpret=interpret)
    for density in densities:
        topk = max(1, round(density * tiles))
        picks = random_picks(keys[4], 1, heads, tiles, topk)
        flops = 4.0 * heads * L * topk * t * head_dim
        settings = dict(density=topk / tiles, topk=topk, tiles=tiles, tile_len=t,
                        shape=list(shape))

        def layer(q, k, v, g, topk=topk, call=table):
            return vsa_attention(q, k, v, g, tile_len=t, topk=topk, kv_mask=mask, call=call)

        name = f"topk={topk}/{tiles} L={L} N={heads} K={head_dim}"
        chosen = groups_of(topk, t, head_dim, groups if density in swept else ())
        runs = [("fine table", functools.partial(
            fine_table, picks=picks, tile_len=t, kv_mask=mask, interpret=bool(interpret),
            group=gr), (q, k, v), dict(group=gr, group_auto=gr == chosen[0]))
            for gr in chosen]
        runs.append(("layer table", layer, (q, k, v, g),
                     dict(group=chosen[0], group_auto=True)))
        for what, fn, args, grouping in runs:
            tag = f"{name} group={grouping['group']}"
            sw.case(f"vsa {what} fwd {tag}", fn, args, flops, peak, direction="fwd",
                    path=what, **settings, **grouping)
            if grad:
                def both(*a, fn=fn):
                    loss = lambda *x: jnp.sum(fn(*x).astype(jnp.float32))  # noqa: E731
                    return jax.grad(loss, argnums=tuple(range(len(a))))(*a)

                sw.case(f"vsa {what} fwd+bwd {tag}", both, args, 3.5 * flops, peak,
                        direction="fwd+bwd", path=what, **settings, **grouping)
        if topk / tiles <= 0.125:
            from ditax.attention.flash import flash_attention

            flash = functools.partial(flash_attention, interpret=interpret)
            sw.case(f"vsa layer gather-flash fwd {name}",
                    functools.partial(layer, call=flash), (q, k, v, g), flops, peak,
                    direction="fwd", path="layer gather-flash", **settings)


#: Wan 2.1 1.3B's token grids (latent frames, rows, columns after the 1 x 2 x 2 patches) at
#: 480 x 832 x 81 and 720 x 1280 x 81: the ``--tiles`` cases' (480p first: a budget cuts 720p)
TILE_GRIDS = ((21, 30, 52), (21, 45, 80))
TILE_DENSITIES = (0.125, 0.25, 0.5)


def tile_cases(sw, grids=TILE_GRIDS, densities=TILE_DENSITIES, heads=HEADS,
               head_dim=HEAD_DIM, interpret=None, dense: bool = True,
               variants=("plain",)) -> None:
    """Issue 58 item 1 (``--tiles``; ``tpu_chip.py --part vsa_tiles``): per grid, dense splash at
    its frame-major tokens, then the table fine pass alone (forward, the group the kernels
    choose) in the default 4 x 8 x 8 tiles and in the tile that pads the grid least
    (``attention.tile=auto``: :func:`ditax.attention.sparse.tiles.least_padding_tile`, at
    most 512 tokens as under ``vsa_fine=table``), at each density (``topk`` the nearest
    share of the tiles). Each row names its ``grid``, ``tile``, ``tile_len``, ``tokens``
    (padded) and ``padding`` (the padded share over the grid's tokens). ``variants``: the
    forward kernel's (:mod:`ditax.attention.kernels.vsa_variant`), each a row of its own
    (``variant``) in the least-padding tile; the default tile runs the first only."""
    import numpy as np

    from ditax.attention.kernels.vsa_table import group_for
    from ditax.attention.sparse.layout import TABLE_MOST
    from ditax.attention.sparse.tiles import DEFAULT, TileOrder, least_padding_tile
    from ditax.attention.sparse.vsa_table import fine_table
    from tpu_sweep import PEAK, _gen, attention_cases

    peak = PEAK.get(_gen(), (197e12,))[0]
    key = jax.random.PRNGKey(0)
    for grid in grids:
        n = int(np.prod(grid))
        if dense:
            attention_cases(sw, (1, n, heads, head_dim), [("splash", {})], grad=False)
        tiles_tried = [DEFAULT] + [t for t in (least_padding_tile(grid, most=TABLE_MOST),)
                                   if t != DEFAULT]
        for n_tile, tile in enumerate(tiles_tried):
            order = TileOrder(tuple(grid), tuple(tile))
            t, tiles, L = order.tile_len, int(np.prod(order.tiles)), order.length
            shape = (1, L, heads, head_dim)
            q, k, v = (jax.random.normal(x, shape, jnp.bfloat16)
                       for x in jax.random.split(key, 3))
            mask = jnp.asarray(order.valid)[None]
            done = set()
            for density in densities:
                topk = max(1, round(density * tiles))
                if topk in done:        # few tiles (a small grid): two densities, one topk
                    continue
                done.add(topk)
                group = group_for(topk, t, head_dim, 2)
                picks = random_picks(jax.random.fold_in(key, topk), 1, heads, tiles, topk)
                settings = dict(density=topk / tiles, topk=topk, tiles=tiles, tile_len=t,
                                shape=list(shape), grid=list(grid), tile=list(tile), tokens=L,
                                padding=round(L / n - 1, 4), group=group, direction="fwd",
                                path="fine table")
                for variant in variants if n_tile == len(tiles_tried) - 1 else variants[:1]:
                    sw.case(f"vsa fine table fwd grid={'x'.join(map(str, grid))} tile="
                            f"{'x'.join(map(str, tile))} topk={topk}/{tiles} L={L}"
                            + ("" if variant == "plain" else f" variant={variant}"),
                            functools.partial(fine_table, picks=picks, tile_len=t,
                                              kv_mask=mask, interpret=bool(interpret),
                                              group=group, variant=variant),
                            (q, k, v), 4.0 * heads * L * topk * t * head_dim, peak,
                            variant=variant, **settings)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    p.add_argument("--budget-s", type=float, default=420)
    p.add_argument("--repeats", type=int, default=4)
    p.add_argument("--no-grad", action="store_true")
    p.add_argument("--small", action="store_true", help="a tiny shape, interpreted (CPU)")
    p.add_argument("--tiles", action="store_true",
                   help="4x8x8 against the least-padding tile at Wan 480p / 720p (tile_cases)")
    p.add_argument("--variants", default="plain",
                   help="--tiles: the table forward's variants in the least-padding tile, "
                        "comma-separated (vsa_variant flags joined by +, e.g. "
                        "plain,bias+lanes+prescale)")
    p.add_argument("--groups", default=",".join(map(str, GROUPS)),
                   help="groups compared with the chosen one at 50 %% and 12.5 %% (e.g. 1,4,8)")
    a = p.parse_args(argv)
    groups = tuple(int(g) for g in a.groups.split(",") if g)
    variants = tuple(v for v in a.variants.split(",") if v)
    from ditax.attention.kernels.vsa_variant import TableVariant

    try:                                    # a typo fails here, in one line, before a compile
        [TableVariant.parse(v) for v in variants]
    except ValueError as e:
        raise SystemExit(f"vsa_table.py --variants: {e}") from None
    from tpu_sweep import Sweep

    sw = Sweep(a.out, a.budget_s, a.repeats)
    if a.small and a.tiles:
        tile_cases(sw, grids=SMALL_GRIDS, heads=2, head_dim=16, interpret=True, dense=False,
                   variants=variants)
        return
    if a.small:
        vsa_cases(sw, grid=(3, 6, 6), tile=(2, 2, 2), heads=2, head_dim=16,
                  grad=not a.no_grad, dense=False, interpret=True, groups=groups)
        return
    from ditax.tpu_env import raise_scoped_vmem

    raise_scoped_vmem()
    if a.tiles:
        tile_cases(sw, variants=variants)
        return
    vsa_cases(sw, grad=not a.no_grad, groups=groups)


#: ``--tiles --small``: 12 tiles of 4 x 8 x 8 against 5 least-padding ones (the CPU code path,
#: interpreted)
SMALL_GRIDS = ((5, 12, 20),)


if __name__ == "__main__":
    main()
