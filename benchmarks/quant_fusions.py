"""Where a W+A int8 forward's time goes that its bf16 twin does not spend, no chip (issue 54
item 3): FLUX.2 compiled for a TPU v5e deviceless (``ditax plan``'s path) — one block
(``double`` / ``single``: the preset with one block of each kind, ``run_blocks`` cut to the
one asked for, the embedding and head around it) or the ``full`` forward (layer loops
scanned) — and its optimized HLO cut into the instructions the chip runs one after another
(a loop body's weighted by its trip count), each timed two ways:

- ``xla_ms``: libtpu's own cost model (the fusion's ``estimated_cycles`` at 1.5 GHz; none for
  a Mosaic kernel such as splash): the one to read;
- ``ms``: a roofline, the products' FLOPs at 197 TFLOP/s (bf16) or 394 TOPS (s8 x s8) against
  the HBM bytes of operands and result (VMEM ``S(1)`` arrays not counted) at 819 GB/s. It
  counts whole operands: a fusion that dynamic-slices one layer's kernel out of a stacked
  ``[L, ...]`` one is charged the whole stack (the ``full`` program's loops), and it knows
  nothing of vector-unit work.

    TPU_SKIP_MDS_QUERY=1 PYTHONPATH=src python benchmarks/quant_fusions.py \\
        [--config flux.2-klein-4b] [--blocks double,single,full] [--modes bf16,wa] [--top 12]

One JSON line per (block, mode): ``ms`` / ``xla_ms`` summed, ``by_kind`` (count, ms, xla_ms
and MB per kind: ``dot`` — a fusion with a matrix product, ``quant`` — round/clip/convert to
s8 without one, ``reduce``, ``elementwise``, ``copy``, ``custom`` (splash) …; async copies and
slices — ``copy-start`` / ``slice-start`` … ``-done``, ``ConcatBitcast`` — under ``async``, not
summed: they overlap the compute), ``xla_ms_per_run`` (the cost model by how often a row runs:
``"20"`` is one single block of the full klein-4B) and ``top`` (the largest rows). ~25 s a
block's compile on 2 cores, ~170 s the full forward's.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_lines import emit  # noqa: E402

BF16_FLOPS, INT8_OPS, HBM, CLOCK = 197e12, 394e12, 819e9, 1.5e9          # TPU v5e
MODES = {"bf16": [], "wa": ["model.quantize=int8", "model.quantize_activations=true"],
         "w": ["model.quantize=int8"]}
SKIP = ("parameter", "get-tuple-element", "bitcast", "tuple", "constant")
#: DMAs the scheduler overlaps with the compute (memory-space prefetches, a producer's result
#: moved in slices and joined by a ConcatBitcast): listed, not summed
ASYNC = ("copy-start", "copy-done", "slice-start", "slice-done")


_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[([\d,]*)\](\{[^}]*\})?")


def hbm_bytes(shape: str) -> int:
    """Bytes of the arrays of an HLO shape that live in HBM (a layout with ``S(1)`` is in
    the core's VMEM: not counted)."""
    from ditax.plan.hlo import DTYPE_BYTES

    total = 0
    for dt, dims, layout in _ARRAY.findall(shape):
        if "S(1)" in (layout or ""):
            continue
        n = 1
        for d in filter(None, dims.split(",")):
            n *= int(d)
        total += n * DTYPE_BYTES.get(dt, 0)
    return total


def _dims(shape: str) -> tuple[str, list[int]]:
    m = re.match(r"\(?([a-z][a-z0-9]*)\[([\d,]*)\]", shape)
    return m.group(1), [int(d) for d in m.group(2).split(",") if d]


def _product_flops(comps, comp_name: str) -> tuple[float, float]:
    """(s8 x s8 ops, other FLOPs) of the convolutions / dots of a computation and those it
    calls. A convolution's contraction: the lhs feature dim times the window over the lhs's
    spatial dims (a 1-wide spatial dim padded to a window reads one tap)."""
    comp = comps[comp_name]
    s8 = other = 0.0
    for ins in comp.instrs.values():
        for _, callee in ins.callees():
            a, b = _product_flops(comps, callee)
            s8, other = s8 + a, other + b
        if ins.opcode not in ("convolution", "dot"):
            continue
        lt, ls = _dims(comp.instrs[ins.operands[0]].shape)
        _, out = _dims(ins.shape)
        n = 1
        for d in out:
            n *= d
        if ins.opcode == "dot":
            cd = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", ins.attrs).group(1)
            k = 1
            for i in filter(None, cd.split(",")):
                k *= ls[int(i)]
        else:
            labels = re.search(r"dim_labels=(\w+?)_", ins.attrs).group(1)
            k = ls[labels.index("f")]
            w = re.search(r"window=\{size=([\dx]+)", ins.attrs)
            if w:
                spatial = [ls[i] for i, c in enumerate(labels) if c.isdigit()]
                for size, have in zip((int(x) for x in w.group(1).split("x")), spatial):
                    k *= min(size, have)
        if lt in ("s8", "u8"):
            s8 += 2.0 * n * k
        else:
            other += 2.0 * n * k
    return s8, other


def _body_ops(comps, comp_name: str, acc: set) -> set:
    for ins in comps[comp_name].instrs.values():
        acc.add(ins.opcode)
        for _, callee in ins.callees():
            _body_ops(comps, callee, acc)
    return acc


def scheduled(comps) -> list[tuple[object, int]]:
    """``(computation, times a call of the program runs it)`` of the computations whose
    instructions the chip runs one by one: the entry and what ``while`` / ``conditional`` /
    ``call`` reach from it (a layer loop's body: its trip count), not fusion bodies."""
    from ditax.plan.hlo import multiplicities

    mult, _, _ = multiplicities(comps)
    entry = next(c for c in comps.values() if c.entry)
    out, todo, seen = [], [entry.name], set()
    while todo:
        name = todo.pop(0)
        if name in seen or name not in comps:
            continue
        seen.add(name)
        out.append((comps[name], max(mult.get(name, 1), 1)))
        for ins in comps[name].instrs.values():
            if ins.opcode in ("while", "conditional", "call"):
                todo += [c for _, c in ins.callees()]
    return out


def fusions(text: str) -> list[dict]:
    """The instructions the chip runs one after another (:func:`scheduled`; a program without
    layer loops: the entry's), in program order, each with ``kind``, ``times`` (per call),
    ``mb`` (HBM operands + result), ``gops_s8`` / ``gflops`` of its products, ``ms``
    (roofline) and ``xla_ms`` (libtpu's estimate), all for one run."""
    from ditax.plan.hlo import parse

    comps = parse(text)
    rows = []
    for comp, times in scheduled(comps):
        rows += _rows(comps, comp, times)
    return rows


def _rows(comps, entry, times: int) -> list[dict]:
    rows = []
    for ins in entry.instrs.values():
        if ins.opcode in SKIP + ("while", "conditional", "call"):
            continue
        read = sum(hbm_bytes(entry.instrs[a].shape) for a in ins.operands
                   if a in entry.instrs)
        nbytes = read + hbm_bytes(ins.shape)
        s8 = other = 0.0
        body = {ins.opcode}
        for _, callee in ins.callees():
            a, b = _product_flops(comps, callee)
            s8, other = s8 + a, other + b
            _body_ops(comps, callee, body)
        if ins.opcode in ASYNC or "ConcatBitcast" in ins.attrs:
            kind = "async"
        elif s8 or other:
            kind = "dot"
        elif ins.opcode == "custom-call":
            kind = "custom"
        elif "round-nearest-even" in body and re.match(r"\(?s8\[", ins.shape):
            kind = "quant"
        elif "reduce" in body:
            kind = "reduce"
        elif ins.opcode == "fusion":
            kind = "elementwise"
        else:
            kind = ins.opcode
        ms = 1e3 * max(s8 / INT8_OPS + other / BF16_FLOPS, nbytes / HBM)
        cycles = re.search(r'"estimated_cycles":"(\d+)"', ins.attrs)
        rows.append({"name": ins.name, "kind": kind, "times": times,
                     "mb": round(nbytes / 1e6, 2),
                     "gops_s8": round(s8 / 1e9, 2), "gflops": round(other / 1e9, 2),
                     "ms": round(ms, 4),
                     "xla_ms": round(1e3 * int(cycles.group(1)) / CLOCK, 4) if cycles else 0.0,
                     "shape": ins.shape.split("{")[0][:80]})
    return rows


def summary(rows: list[dict]) -> dict:
    by = defaultdict(lambda: {"n": 0, "ms": 0.0, "xla_ms": 0.0, "mb": 0.0})
    for r in rows:
        b = by[r["kind"]]
        b["n"] += r.get("times", 1)
        for k in ("ms", "xla_ms", "mb"):
            b[k] += r[k] * r.get("times", 1)
    by = {k: {"n": v["n"], "ms": round(v["ms"], 3), "xla_ms": round(v["xla_ms"], 3),
              "mb": round(v["mb"], 1)}
          for k, v in sorted(by.items(), key=lambda kv: -kv[1]["ms"])}
    total = lambda key: round(sum(v[key] for k, v in by.items() if k != "async"), 3)  # noqa
    loops = defaultdict(float)          # libtpu's estimate by how often a row runs (a loop)
    for r in rows:
        if r["kind"] != "async":
            loops[r.get("times", 1)] += r["xla_ms"]
    return {"ms": total("ms"), "xla_ms": total("xla_ms"), "by_kind": by,
            "xla_ms_per_run": {str(t): round(v, 3) for t, v in sorted(loops.items())}}


@contextlib.contextmanager
def only_block(cls, start: int, stop: int):
    """``cls.run_blocks`` cut to blocks ``start .. stop-1`` while tracing."""
    orig = cls.run_blocks

    def cut(self, h, ctx, *_args, **_kw):
        return orig(self, h, ctx, start, stop)

    cls.run_blocks = cut
    try:
        yield
    finally:
        cls.run_blocks = orig


def block_hlo(config: str, block: str, mode: str, extra=()) -> str:
    """The optimized v5e HLO of ``config``'s forward with one ``block`` (``double`` /
    ``single``; ``full``: the whole forward, its layer loops scanned) in ``mode``
    (:data:`MODES`)."""
    import jax
    from flax import nnx

    from ditax.config import load_config
    from ditax.front.run import run_context
    from ditax.models.base import model_family
    from ditax.parallel import make_mesh
    from ditax.plan.core import _forward, _quantize
    from ditax.plan.targets import parse_target, topology_devices

    devices = topology_devices(parse_target("tpu-v5e-1"))
    one = [] if block == "full" else ["model.num_layers=1", "model.num_single_layers=1"]
    cfg = load_config(config, [*one, *MODES[mode], *extra])
    mesh = make_mesh(cfg.mesh, devices)
    with run_context(cfg.attention, mesh, compile_cache="none", say=lambda *_: None):
        family = model_family(cfg.model, cfg.attention)
        model = family.abstract(mesh)
        _quantize(cfg.model, model, devices)
        gdef, state = nnx.split(model)
        sh = family.param_shardings(state, mesh)
        latent = family.latent_shape(cfg.sample.num_frames, cfg.sample.height,
                                     cfg.sample.width)[1:]
        start, stop = {"double": (0, 1), "single": (1, 2)}.get(block, (0, None))
        with only_block(type(model), start, stop):
            lowered, _, _ = _forward(cfg, mesh, family, gdef, state, sh, latent)
        del jax
        return lowered.compile().as_text()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="flux.2-klein-4b")
    p.add_argument("--blocks", default="double,single")
    p.add_argument("--modes", default="bf16,wa")
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--dump", default=None, help="folder for the HLO texts")
    p.add_argument("--hlo", nargs="*", default=None,
                   help="read these HLO files (BLOCK-MODE.hlo) instead of compiling")
    p.add_argument("--set", nargs="*", default=[], help="more key=value overrides")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    jobs = ([(os.path.basename(f).rsplit(".", 1)[0], f) for f in args.hlo] if args.hlo else
            [(f"{b}-{m}", None) for b in args.blocks.split(",") for m in args.modes.split(",")])
    for name, path in jobs:
        block, mode = name.split("-", 1)
        if path:
            text = open(path).read()
        else:
            text = block_hlo(args.config, block, mode, args.set)
            if args.dump:
                os.makedirs(args.dump, exist_ok=True)
                with open(os.path.join(args.dump, f"{name}.hlo"), "w") as f:
                    f.write(text)
        rows = fusions(text)
        top = sorted(rows, key=lambda r: -r["ms"])[:args.top]
        emit({"bench": "quant_fusions", "config": args.config, "block": block, "mode": mode,
              **summary(rows), "top": top}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
