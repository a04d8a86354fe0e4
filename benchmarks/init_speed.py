"""Random init's compile time on one TPU chip, compiled deviceless (no TPU needed; libtpu):
the programs :func:`ditax.models.common.loaded.init_module` runs for a config (one a group of
at most a quarter of the chip's memory), each lowered and compiled as on the chip. One JSON
line per program (lower / compile wall seconds, compile CPU seconds, compiled HLO size,
temporaries) and a summary line per case (trace seconds: ``init`` traced once; totals).

    python benchmarks/init_speed.py [--case wan2.1-t2v-1.3b --case "wan2.1-t2v-14b
        model.offload=host" ...] [--target tpu-v5e-1] [--out docs/init_speed_v5e.jsonl]

A TPU compile's time grows with the elements each fusion of the program writes: a stack
drawn by an ``nnx.vmap`` over 30 layers compiled its 30-layer draws (Wan 2.1 1.3B: a minute
and more for a v5e); drawn under a scan (:func:`ditax.nn.stack.make_stack`) it compiles
one layer's. CPU seconds are the process's (this host may be shared; wall seconds vary).
"""

from __future__ import annotations

import argparse
import importlib
import os
import resource
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")

import jax  # noqa: E402

from init_memory import BUILDS, HBM, emit  # noqa: E402  (benchmarks/ is the script's path)

CASES = ["wan2.1-t2v-1.3b", "wan2.1-t2v-14b model.offload=host", "flux.2-klein-4b"]


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def measure(case: str, target: str, out) -> None:
    import ditax
    from ditax.config import load_config
    from ditax.models.base import model_family
    from ditax.models.common import loaded
    from ditax.parallel.mesh import make_mesh
    from ditax.plan.targets import parse_target, topology_devices

    words = case.split()
    cfg = load_config(words[0], ["model.dtype=bfloat16", *words[1:]])
    mesh = make_mesh(dict(data=1, fsdp=1, context=1, tensor=1),
                     topology_devices(parse_target(target))[:1])
    build = importlib.import_module(BUILDS[model_family(cfg.model, cfg.attention).name])._BUILD
    kind = {"tpu-v5e-1": "TPU v5 lite", "tpu-v6e-1": "TPU v6 lite"}[target]
    base = {"bench": "init_speed", "case": case, "target": target}
    with ditax.target_platform("tpu", device_kind=kind):
        t = time.perf_counter()
        _, init, shardings = loaded._init_parts(*build._init(cfg.model, cfg.attention, mesh, 0))
        tree, programs = loaded.group_programs(init, shardings, HBM[target] // 4)
        trace_s = time.perf_counter() - t
        total = {"lower_s": 0.0, "compile_s": 0.0, "compile_cpu_s": 0.0}
        worst = 0
        for n, (group, program) in enumerate(programs):
            t = time.perf_counter()
            lowered = program.lower()
            lower_s = time.perf_counter() - t
            t, c = time.perf_counter(), cpu_s()
            compiled = lowered.compile()
            row = {"lower_s": lower_s, "compile_s": time.perf_counter() - t,
                   "compile_cpu_s": cpu_s() - c}
            for k in total:
                total[k] += row[k]
            temp = compiled.memory_analysis().temp_size_in_bytes
            worst = max(worst, temp)
            emit(out, {**base, "program": n, "leaves": len(group),
                       **{k: round(v, 2) for k, v in row.items()},
                       "hlo_chars": len(compiled.as_text()), "temp_bytes": temp})
        emit(out, {**base, "metric": "init compile", "programs": len(programs),
                   "leaves": tree.num_leaves, "trace_s": round(trace_s, 2),
                   **{k: round(v, 2) for k, v in total.items()},
                   "largest_temp_bytes": worst, "group_bytes": HBM[target] // 4,
                   "jax": jax.__version__})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--case", action="append", help="preset and key=value overrides, quoted "
                   f"(repeatable; default: {CASES})")
    p.add_argument("--target", default="tpu-v5e-1", choices=sorted(HBM))
    p.add_argument("--out", default=None)
    a = p.parse_args()
    for case in a.case or CASES:
        measure(case, a.target, a.out)


if __name__ == "__main__":
    main()
