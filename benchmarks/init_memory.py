"""Random init's device memory on one TPU chip, compiled deviceless (no TPU needed; libtpu):
the one-program init against the grouped init ``ditax`` runs
(:func:`ditax.models.common.loaded.init_module`), per program ``temp`` / ``output`` /
``host output`` bytes from XLA's memory analysis. One JSON line per program and a summary
line per case.

    python benchmarks/init_memory.py --config wan2.1-t2v-14b model.offload=host \
        [--target tpu-v5e-1] [--out docs/init_memory_v5e.jsonl]

On a v5e (15.75 GiB HBM) the one program that drew Wan 2.1 14B with ``model.offload=host``
needed 18.8 GB of temporaries (the OOM the chip reported); grouped in programs of a quarter
of the chip's memory each, no program needs more than one group's draws.
"""

from __future__ import annotations

import argparse
import importlib
import os
import time
from bench_lines import emit

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")

BUILDS = {"wan": "ditax.models.wan.build", "flux": "ditax.models.flux.build",
          "flux2": "ditax.models.flux2.build", "ltx2": "ditax.models.ltx2.transformer.build"}
HBM = {"tpu-v5e-1": int(15.75 * 2**30), "tpu-v6e-1": 32 * 2**30}




def main() -> None:
    import ditax
    from ditax.config import load_config
    from ditax.models.base import model_family
    from ditax.models.common import loaded
    from ditax.parallel.mesh import make_mesh
    from ditax.plan.targets import parse_target, topology_devices

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", nargs="+", required=True, help="preset and key=value overrides")
    p.add_argument("--target", default="tpu-v5e-1", choices=sorted(HBM))
    p.add_argument("--whole", action="store_true", help="compile the one-program init too")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    cfg = load_config(a.config[0], ["model.dtype=bfloat16", *a.config[1:]])
    mesh = make_mesh(dict(data=1, fsdp=1, context=1, tensor=1),
                     topology_devices(parse_target(a.target))[:1])
    fam = model_family(cfg.model, cfg.attention)
    build = importlib.import_module(BUILDS[fam.name])._BUILD
    kind = {"tpu-v5e-1": "TPU v5 lite", "tpu-v6e-1": "TPU v6 lite"}[a.target]
    case = " ".join(a.config)
    budget = HBM[a.target] // 4
    with ditax.target_platform("tpu", device_kind=kind):
        gdef, init, out = loaded._init_parts(*build._init(cfg.model, cfg.attention, mesh, 0))
        programs = loaded.group_programs(init, out, budget)[1]
        if a.whole:
            programs = loaded.group_programs(init, out, None)[1] + programs
        worst = 0
        for n, (group, program) in enumerate(programs):
            t = time.time()
            mem = program.lower().compile().memory_analysis()
            whole = a.whole and n == 0
            row = {"bench": "init_memory", "case": case, "target": a.target,
                   "program": "whole" if whole else f"group {n - int(a.whole)}",
                   "leaves": len(group), "temp_bytes": mem.temp_size_in_bytes,
                   "output_bytes": mem.output_size_in_bytes,
                   "host_output_bytes": mem.host_output_size_in_bytes,
                   "compile_s": round(time.time() - t, 1)}
            emit(row, a.out)
            if not whole:
                worst = max(worst, mem.temp_size_in_bytes)
        emit({"bench": "init_memory", "case": case, "target": a.target,
                     "metric": "largest group temp", "value": worst, "unit": "bytes",
                     "programs": len(programs) - int(a.whole), "group_bytes": budget,
                     "hbm_bytes": HBM[a.target]})


if __name__ == "__main__":
    main()
