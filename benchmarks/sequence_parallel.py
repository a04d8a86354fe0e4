"""Sequence-parallel attention: wall time, collective bytes and an HLO relayout audit.

One self-attention at a fixed per-device shape, for each backend × out_a2a mode × local
kernel. Prints one JSON object per line (DESIGN "Benchmarks"). The audit counts, in the
compiled (optimized) HLO, the copy/transpose ops that feed or consume each all-to-all, so the
relayout that ``shard_major`` removes is visible.

Caveat printed with every run: XLA CPU lowers all-to-all differently from TPU/GPU (no ICI
/ NCCL, memcpy between host buffers), so the audit shows the program's structure, and the
CPU times say nothing about accelerator speed.

    python benchmarks/sequence_parallel.py [--devices 8] [--L-local 64] [--heads 8] [--K 64]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time


def _parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--L-local", type=int, default=64, help="tokens per device")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--K", type=int, default=64)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--iters", type=int, default=3)
    return ap.parse_args()


_INST = re.compile(r"^\s*(?:ROOT\s+)?(%?[\w.\-]+)\s*=\s*(\([^=]*?\)|\S+)\s+([\w\-]+)\((.*?)\)")
_SHAPE = re.compile(r"(f32|bf16|f16|s32|pred|u32)\[([\d,]*)\]")
_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "pred": 1}
COLLECTIVES = ("all-to-all", "collective-permute", "all-gather", "all-reduce")


def _nbytes(shape: str) -> int:
    total = 0
    for dt, dims in _SHAPE.findall(shape):
        n = 1
        for d in filter(None, dims.split(",")):
            n *= int(d)
        total += n * _BYTES[dt]
    return total


def audit(hlo: str) -> dict:
    """Collective bytes and relayout copies/transposes adjacent to each all-to-all."""
    insts, users = {}, {}
    for line in hlo.splitlines():
        m = _INST.match(re.sub(r"/\*.*?\*/", "", line))
        if not m:
            continue
        name, shape, op, args = m.groups()
        name = name.lstrip("%")
        operands = [a.lstrip("%") for a in re.findall(r"%?([\w.\-]+)", args)]
        insts[name] = (shape, op, operands)
        for o in operands:
            users.setdefault(o, []).append(name)

    def relayout(n):
        shape, op, _ = insts.get(n, ("", "", []))
        return op in ("copy", "transpose") or (op == "fusion" and ("copy" in n or "transpose" in n))

    out = {f"{c}_count": 0 for c in COLLECTIVES}
    out.update({f"{c}_bytes": 0 for c in COLLECTIVES})
    adj_n = adj_b = 0
    for name, (shape, op, operands) in insts.items():
        base = op.replace("-start", "")
        if base in COLLECTIVES and not op.endswith("-done"):
            out[f"{base}_count"] += 1
            out[f"{base}_bytes"] += _nbytes(shape)
        if base == "all-to-all":
            near = list(operands)
            for u in users.get(name, []):   # tuple-shaped all-to-all: look through the GTEs
                near += users.get(u, []) if insts[u][1] == "get-tuple-element" else [u]
            for n in near:
                if relayout(n):
                    adj_n += 1
                    adj_b += _nbytes(insts[n][0])
    out["a2a_adjacent_relayouts"] = adj_n
    out["a2a_adjacent_relayout_bytes"] = adj_b
    return out


def main():
    args = _parse_args()
    os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={args.devices}")
    import jax
    import jax.numpy as jnp
    import numpy as np

    from ditax.attention import attend
    from ditax.parallel.mesh import make_mesh

    C = len(jax.devices())
    mesh = make_mesh({"context": C})
    B, L, N, K = args.batch, args.L_local * C, args.heads, args.K
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((B, L, N, K)), jnp.float32) for _ in range(3))
    note = ("XLA CPU lowers all-to-all differently from TPU/GPU (host memcpy, no ICI/NCCL); "
            "times are CPU-only, the HLO audit shows program structure")
    print(json.dumps({"bench": "sequence_parallel", "note": note,
                      "platform": jax.default_backend(), "devices": C,
                      "shape_per_device": [B, args.L_local, N, K]}))
    cases = []
    for local in ("xla", "flash"):
        for mode in ("flat", "chunked", "shard_major"):
            if mode == "shard_major" and local != "flash":
                continue
            cases.append(("ulysses", dict(local=local, out_a2a=mode)))
    cases.append(("ring", dict(local="xla")))
    if C % 2 == 0 and C > 2:
        for mode in ("flat", "shard_major"):
            cases.append(("ulysses_ring", dict(local="flash", out_a2a=mode,
                                               ulysses_shards=C // 2)))
    for backend, opts in cases:
        fn = jax.jit(lambda q, k, v, b=backend, o=opts: attend(q, k, v, backend=b, mesh=mesh,
                                                                block_q=64, block_kv=64, **o))
        compiled = fn.lower(q, k, v).compile()
        stats = audit(compiled.as_text())
        fn(q, k, v).block_until_ready()
        t = time.perf_counter()
        for _ in range(args.iters):
            fn(q, k, v).block_until_ready()
        dt = (time.perf_counter() - t) / args.iters
        case = f"{backend}/{opts.get('local')}/{opts.get('out_a2a', 'flat')}"
        print(json.dumps({"bench": "sequence_parallel", "case": case, "metric": "wall_time",
                          "value": round(dt, 6), "unit": "s", **stats, "note": note}))


if __name__ == "__main__":
    main()
