"""What fits one chip for the big Wan models (docs/plan_big_models.md): ``ditax plan --fit``
compiled deviceless (libtpu, no TPU attached, ``TPU_SKIP_MDS_QUERY=1``) for

- ``wan21-14b-v5e``: Wan 2.1 T2V 14B, 1280x720 x 81 frames, bf16, on one v5e chip (16 GB);
- ``wan22-a14b-v6e``: Wan 2.2 T2V A14B (two 14B experts held, one runs a step) on one v6e
  chip (32 GB);

every rung of the ladder (as configured, + model.offload=host, + model.quantize=int8,
+ text_quantize=int8) and the VAE decode. A 40-layer 720p compile on a 2-core CPU takes many
minutes, so ``--layers`` (default 2) transformer layers are compiled and the rest is scaled
(:mod:`ditax.plan.fit` says how). Prints one JSON object per rung and one per case summary:
``python benchmarks/plan_big_models.py --case wan21-14b-v5e [--layers 2] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

CASES = {"wan21-14b-v5e": ("wan2.1-t2v-14b", "tpu-v5e-1"),
         "wan22-a14b-v6e": ("wan2.2-t2v-a14b", "tpu-v6e-1")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", choices=sorted(CASES), required=True)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--no-decode", action="store_true")
    ap.add_argument("--out", default=None, help="also append the JSON lines to this file")
    a = ap.parse_args()

    from ditax.cli.run import run_context
    from ditax.config import load_config, validate
    from ditax.parallel import make_mesh
    from ditax.plan.fit import fit
    from ditax.plan.targets import parse_target, topology_devices

    preset, target_name = CASES[a.case]
    target = parse_target(target_name)
    devices = topology_devices(target)
    cfg = load_config(preset, [])
    validate(cfg, len(devices))
    mesh = make_mesh(cfg.mesh, devices)
    t = time.perf_counter()
    with run_context(cfg.attention, mesh, compile_cache="none"):
        out = fit(cfg, mesh, target.chip, layers=a.layers, decode_=not a.no_decode,
                  every_rung=True, say=lambda line: print(f"# {line}", flush=True))
    base = dict(bench="plan_big_models", case=a.case, config=preset, target=target_name,
                chip=out["chip"], hbm_bytes=out["hbm_bytes"], video="81x720x1280",
                dtype=cfg.model.dtype, batch=out["batch"], experts=out["experts"],
                layers=out["layers"], compiled_layers=out["compiled_layers"],
                host_link_bytes_per_s=out["host_link_bytes_per_s"])
    lines = []
    for r in out["rungs"]:
        d = r["denoise"]["step"]
        lines.append({**base, "metric": "rung", "changes": r["changes"],
                      **{k: r[k] for k in ("offload", "quantize", "text_offload",
                                           "text_quantize")},
                      **{f"{p}_bytes": r[p].get("bytes") for p in ("text", "denoise", "decode")
                         if p in r},
                      **{f"{p}_fits": r[p]["fits"] for p in ("text", "denoise", "decode")
                         if p in r},
                      "step": d})
    lines.append({**base, "metric": "summary", "verdict": out["verdict"],
                  "decode": out["decode"], "measured": out["measured"],
                  "analytic": out["analytic"], "wall_s": round(time.perf_counter() - t, 1)})
    text = "\n".join(json.dumps(x) for x in lines)
    print(text, flush=True)
    if a.out:
        with open(a.out, "a") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
