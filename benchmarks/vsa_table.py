"""VSA on a chip (issue 58 item 5): the table fine pass (``attention.vsa_fine=table``, Pallas
kernels reading the picks, :mod:`ditax.attention.sparse.vsa_table`) against dense splash at
Wan 2.1 1.3B's self-attention, densities 50 / 25 / 12.5 % (``topk`` 84 / 42 / 21 of the 168
tiles of 4 x 8 x 8 tokens), forward and forward + backward. One JSON line per case (the
sweep's rows, :mod:`tpu_sweep`).

    source benchmarks/tpu_setup.sh
    python benchmarks/vsa_table.py --out $OUT/vsa.jsonl --budget-s 420
    # or as a part of the chip's table: python benchmarks/tpu_chip.py --part vsa ...

Cases (bf16, ``B = 1``, ``N = 12``, ``K = 128``):

- ``dense splash``: ``attend(backend="splash")`` at the model's 32760 frame-major tokens;
- ``vsa fine table``: the fine pass alone on the 43008 tile-major tokens (the 21 x 30 x 52
  grid padded to whole tiles, padding keys masked), random picks (distinct per query tile);
- ``vsa layer table``: the whole layer (pooled pass, picks, table fine pass, gate);
- ``vsa layer gather-flash`` at 12.5 % only, forward only: the flash-row path, whose gathered
  K / V are ``topk`` times K / V (at 25 % and 50 % they would not fit the chip's 16 GiB).

``flops`` counts the fine pass's ``4 · B · N · L · topk · t · K`` (x 3.5 with the backward),
not the pooled pass. ``--small`` runs a tiny shape interpreted (the code path on CPU; times
mean nothing there). Not yet run on a chip.
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
DENSITIES = (0.5, 0.25, 0.125)


def random_picks(key, b: int, n: int, tiles: int, topk: int):
    """``[b, n, tiles, topk]`` int32: distinct key tiles per query tile, uniformly drawn."""
    return jnp.argsort(jax.random.uniform(key, (b, n, tiles, tiles)), -1)[..., :topk].astype(
        jnp.int32)


def vsa_cases(sw, grid=GRID, tile=TILE, heads=HEADS, head_dim=HEAD_DIM,
              densities=DENSITIES, grad: bool = True, dense: bool = True,
              interpret=None) -> None:
    """The module docstring's cases on ``sw`` (a :class:`tpu_sweep.Sweep`)."""
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

        def fine_fn(q, k, v, picks=picks):
            return fine_table(q, k, v, picks, t, mask, interpret=bool(interpret))

        def layer(q, k, v, g, topk=topk, call=table):
            return vsa_attention(q, k, v, g, tile_len=t, topk=topk, kv_mask=mask, call=call)

        name = f"topk={topk}/{tiles} L={L} N={heads} K={head_dim}"
        for what, fn, args in (("fine table", fine_fn, (q, k, v)),
                               ("layer table", layer, (q, k, v, g))):
            sw.case(f"vsa {what} fwd {name}", fn, args, flops, peak, direction="fwd",
                    path=what, **settings)
            if grad:
                def both(*a, fn=fn):
                    loss = lambda *x: jnp.sum(fn(*x).astype(jnp.float32))  # noqa: E731
                    return jax.grad(loss, argnums=tuple(range(len(a))))(*a)

                sw.case(f"vsa {what} fwd+bwd {name}", both, args, 3.5 * flops, peak,
                        direction="fwd+bwd", path=what, **settings)
        if topk / tiles <= 0.125:
            from ditax.attention.flash import flash_attention

            flash = functools.partial(flash_attention, interpret=interpret)
            sw.case(f"vsa layer gather-flash fwd {name}",
                    functools.partial(layer, call=flash), (q, k, v, g), flops, peak,
                    direction="fwd", path="layer gather-flash", **settings)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    p.add_argument("--budget-s", type=float, default=420)
    p.add_argument("--repeats", type=int, default=4)
    p.add_argument("--no-grad", action="store_true")
    p.add_argument("--small", action="store_true", help="a tiny shape, interpreted (CPU)")
    a = p.parse_args(argv)
    from tpu_sweep import Sweep

    sw = Sweep(a.out, a.budget_s, a.repeats)
    if a.small:
        vsa_cases(sw, grid=(3, 6, 6), tile=(2, 2, 2), heads=2, head_dim=16,
                  grad=not a.no_grad, dense=False, interpret=True)
        return
    from ditax.tpu_env import raise_scoped_vmem

    raise_scoped_vmem()
    vsa_cases(sw, grad=not a.no_grad)


if __name__ == "__main__":
    main()
