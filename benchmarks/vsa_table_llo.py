"""The VSA table forward kernel's static schedule, no chip (issue 58 item 5): the kernel
(:func:`ditax.attention.kernels.vsa_table.table_forward`) compiled by libtpu for a v5e
(deviceless), its final VLIW bundles dumped and cut into a grid step's parts, next to
ditax's dense flash forward at the same tile. The way :mod:`flash_tpu` ``--llo`` does it
(its bundle regex and dump flags; one child process a kernel: libtpu reads the dump
flags when it starts). Static: stalls (DMA waits that block, interlocks) are not in it.

    PYTHONPATH=src python benchmarks/vsa_table_llo.py [--groups 1,0,11] [--variants plain,bias]

Shape: Wan 2.1 1.3B 480p under ``attention.tile=auto`` (3 x 32 x 4 = 384-token tiles, 91
tiles, 34,944 tokens, 12 heads x 128, bf16, packed ``[B, L, N·K]``, key mask on), ``topk``
11 (12.1 %); ``--groups``: 0 is :func:`~ditax.attention.kernels.vsa_table.group_for`'s.
One JSON line a kernel: ``value`` = static bundles per picked key tile (one query tile's
grid steps, :func:`runs_per_query_tile`, over ``topk``; dense flash: per key block),
``per_query_tile``, ``scalar_only_per_tile`` (bundles with no vector op: index maps from the
table, DMA issue and waits, pipeline bookkeeping: the per-step overhead),
``vector_per_tile`` (the fold: products, online softmax, init / finish), ``ops_per_tile``
(:data:`CLASSES`: MXU pushes and pops, EUP, cross-lane, VALU, vector loads and stores, DMA)
and ``mxu_floor_per_tile`` (the pushes on 4 MXUs: the products' own bound).
~3-10 s a kernel on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

GRID, TILE, HEADS, HEAD_DIM, TOPK = (21, 30, 52), (3, 32, 4), 12, 128, 11

#: op classes of a fold (by the op's name in the bundle text)
CLASSES = {
    "mxu_push": r"vmatmul",
    "mxu_pop": r"vpop\.f32\.mrf",
    "eup": r"vpow2|vlog2|vrcp|vpop\.eup",
    "xlu": r"vperm|vpop\.permute|vpop\.xlane|vmax\.xlane|vadd\.xlane|vxpose",
    "select_compare": r"vsel|vcmp",
    "valu_other": r"vadd\.f32|vsub\.f32|vmul\.f32|vmax\.f32|vpack|vand|vor|vweird",
    "vld": r"vld",
    "vst": r"vst",
    "dma": r"dma\.|vsyncadd|vsyncpa",
}


def parse(path: str) -> list[tuple[str, int, str]]:
    """``(mark, depth, text)`` of each bundle (:data:`flash_tpu.BUNDLE`)."""
    from flash_tpu import BUNDLE

    rows = []
    for line in open(path):
        m = BUNDLE.match(line)
        if m:
            rows.append((m.group(2), len(m.group(3)), m.group(4) + line[m.end():]))
    return rows


def regions(rows) -> list[tuple[int, int]]:
    """``(start, stop)`` bundle spans skipped by a forward branch (``sbr.rel ... target =
    $regionN``: from after it to the fallthrough bundle that names region N)."""
    spans = []
    for i, (_, _, text) in enumerate(rows):
        m = re.search(r"sbr\.rel \([^)]*\) target = \$region(\d+)", text)
        if not m:
            continue
        tag = re.compile(rf"region {m.group(1)}\b")
        for j in range(i + 1, len(rows)):
            if rows[j][0] == "PF" and tag.search(rows[j][2]):
                spans.append((i + 1, j))
                break
    return spans


def count(rows, pattern: str) -> int:
    return sum(len(re.findall(rf"= (?:{pattern})[\w.]*", r[2])) for r in rows)


def runs_per_query_tile(rows, steps: int, trips=()) -> list[int]:
    """How often each bundle runs for one query tile of ``steps`` grid steps: the grid
    loop's straight code and each predicated region every step, except the innermost ones
    that run once (init: stores and no matmul; finish: the log of the log-sum-exp, with the
    last step's fold where the compiler merged them) or ``steps - 1`` times (the full fold
    where the last step has its own); bundles outside the loop 0."""
    runs = [steps if r[1] >= 1 else 0 for r in rows]
    spans = regions(rows)
    inner = [(a, b) for a, b in spans
             if not any(a <= c < d <= b and (c, d) != (a, b) for c, d in spans)]
    mm = [(a, b) for a, b in inner if count(rows[a:b], "vmatmul")]
    full = [s for s in mm if not count(rows[s[0]:s[1]], "vlog2")]
    largest = max(full, key=lambda s: s[1] - s[0]) if len(mm) > 1 and full else None
    for a, b in inner:
        r = rows[a:b]
        if count(r, "vlog2") or (not count(r, "vmatmul") and count(r, "vst") >= 8):
            n = 1
        elif (a, b) == largest and not count(r, "vlog2"):
            n = steps - 1
        elif (a, b) in mm and largest is not None:
            n = 1
        else:
            continue
        runs[a:b] = [n] * (b - a)
    starts = [i for i, r in enumerate(rows) if r[0] == "LB" and r[1] == 2]
    for i, n in zip(starts, trips):               # a rolled loop in the step: its trips
        j = i
        while j < len(rows) and rows[j][1] >= 2:
            runs[j] *= n
            j += 1
    return runs


VECTOR = re.compile(r"= v(?!sync)|vmatmul|vst")


def query_tile_stats(path: str, steps: int, picks: int, trips=()) -> dict:
    """One query tile's static bundles (all its grid steps: :func:`runs_per_query_tile`)
    from one kernel's final bundles, per picked key tile, split into bundles with no vector
    op (scalar only: index maps from the table, DMA issue and waits, pipeline bookkeeping)
    and the rest; the op classes (:data:`CLASSES`) per picked tile."""
    rows = parse(path)
    runs = runs_per_query_tile(rows, steps, trips)
    total = sum(runs)
    scalar = sum(n for n, r in zip(runs, rows) if not VECTOR.search(r[2]))
    ops = {c: round(sum(n * count([r], p) for n, r in zip(runs, rows) if n) / picks, 1)
           for c, p in CLASSES.items()}
    return {"metric": "bundles_per_picked_tile", "value": round(total / picks, 1),
            "unit": "bundles", "per_query_tile": total, "steps": steps,
            "scalar_only_per_tile": round(scalar / picks, 1),
            "vector_per_tile": round((total - scalar) / picks, 1), "ops_per_tile": ops,
            "mxu_floor_per_tile": round(ops["mxu_push"] / 4, 1), "bundles": len(rows)}


def child(a) -> None:
    """Compile one kernel for a v5e (deviceless): ``--one flash`` or ``--one G:variant``."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from ditax.attention.sparse.tiles import TileOrder
    from ditax.parallel.platform import target_platform
    from ditax.plan.targets import parse_target, topology_devices

    dev = topology_devices(parse_target("tpu-v5e-1"))[0]
    rep = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array([dev]), ("x",)),
                                     jax.sharding.PartitionSpec())
    order = TileOrder(GRID, TILE)
    t, T, L = order.tile_len, int(np.prod(order.tiles)), order.length

    def arg(shape, dtype=jnp.bfloat16):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=rep)

    with target_platform("tpu", device_kind=dev.device_kind):
        if a.one == "flash":
            from ditax.attention.flash import flash_attention_tuned, flash_tune

            x = arg((1, L, HEADS, HEAD_DIM))
            _, _, tune = flash_tune(x, x, block_q=t, block_kv=t, block_kv_compute=t)
            fn = lambda q, k, v: flash_attention_tuned(  # noqa: E731
                q, k, v, tune, block_q=t, block_kv=t, interpret=False)
            jax.jit(fn).lower(x, x, x).compile()
            return
        from ditax.attention.kernels.vsa_table import table_forward

        group, variant = a.one.split(":")
        x = arg((1, L, HEADS * HEAD_DIM))
        fn = lambda q, k, v, m, p: table_forward(  # noqa: E731
            q, k, v, m, p, scale=HEAD_DIM ** -0.5, interpret=False, group=int(group),
            variant=variant)
        jax.jit(fn).lower(x, x, x, arg((1, T, 1, t), jnp.int32),
                          arg((1, HEADS, T, a.topk), jnp.int32)).compile()


def row_trips(one: str, topk: int, t: int = 384) -> list[int]:
    """The trips of a table kernel's rolled row loops (``rows``), full fold then last."""
    from ditax.attention.kernels.vsa_variant import TableVariant

    group, variant = one.split(":")
    g, vt = int(group), TableVariant.parse(variant)
    last = topk - (-(-topk // g) - 1) * g
    return [t // vt.row_block(t, n) for n in ([g] if last == g else [g, last])]


def kernel_row(name: str, one: str, topk: int, group: int, tiles: int = 91) -> dict:
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, TPU_SKIP_MDS_QUERY="1", JAX_PLATFORMS="cpu", LIBTPU_INIT_ARGS=(
            f"--xla_tpu_scoped_vmem_limit_kib=98304 --xla_jf_dump_to={d} "
            f"--xla_jf_dump_llo_text=true --xla_jf_dump_llo_pass_label_regex=final_bundles"))
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", one,
                            "--topk", str(topk)], env=env, capture_output=True, text=True)
        want = "ditax_flash_fwd" if one == "flash" else "ditax_vsa_table_fwd"
        found = [f for f in os.listdir(d) if f.endswith("final_bundles.txt") and want in f
                 and "schedule-analysis" not in f]
        row = {"bench": "vsa_table_llo", "case": f"forward {name}", "kernel": name,
               "group": group, "topk": topk, "tile_len": 384, "chip": "v5e",
               "compile_s": round(time.perf_counter() - t0, 1)}
        if r.returncode or not found:
            row["error"] = (r.stderr.strip().splitlines() or ["no kernel dump"])[-1][:300]
        else:
            steps = tiles if one == "flash" else -(-topk // group)
            row.update(query_tile_stats(os.path.join(d, found[0]), steps,
                                        tiles if one == "flash" else topk,
                                        () if one == "flash" else row_trips(one, topk)))
    return row


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--groups", default="1,0,11", help="groups (0: group_for's choice)")
    p.add_argument("--variants", default="plain", help="table variants, comma-separated")
    p.add_argument("--topk", type=int, default=TOPK)
    p.add_argument("--no-flash", action="store_true")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    sys.path.insert(0, os.path.join(HERE, "..", "src"))
    if a.one:
        return child(a)
    from ditax.attention.kernels.vsa_table import group_for

    if not a.no_flash:
        print(json.dumps(kernel_row("dense flash 384", "flash", a.topk, 1)), flush=True)
    for variant in a.variants.split(","):
        for g in (int(x) for x in a.groups.split(",")):
            g = min(a.topk, g or group_for(a.topk, 384, HEAD_DIM, 2))
            row = kernel_row(f"table G={g} {variant}", f"{g}:{variant}", a.topk, g)
            print(json.dumps({**row, "variant": variant}), flush=True)


if __name__ == "__main__":
    main()
