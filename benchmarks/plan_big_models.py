"""What fits one chip for the big Wan models (docs/plan_big_models.md): ``ditax plan --fit``
compiled deviceless (libtpu, no TPU attached, ``TPU_SKIP_MDS_QUERY=1``) for

- ``wan21-14b-v5e``: Wan 2.1 T2V 14B, 1280x720 x 81 frames, bf16, on one v5e chip (16 GB);
- ``wan22-a14b-v6e``: Wan 2.2 T2V A14B (two 14B experts held, one runs a step) on one v6e
  chip (32 GB);

every rung of the ladder (as configured, + model.offload=host, + model.quantize=int8,
+ text_quantize=int8) and the VAE decode. Every layer is compiled (the layer loop is one
scanned body: a 40-layer 720p compile takes about as long as a 2-layer one, 80 s here, while
the VAE decode's takes 3-4 minutes); ``--layers N`` compiles N and scales
(:mod:`ditax.plan.fit` says how). Prints one JSON object per rung and one per case summary:
``python benchmarks/plan_big_models.py --case wan21-14b-v5e [--layers 2] [--out FILE]``;
``--table FILE`` prints the markdown table of such lines.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from bench_lines import emit

os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

CASES = {"wan21-14b-v5e": ("wan2.1-t2v-14b", "tpu-v5e-1"),
         "wan22-a14b-v6e": ("wan2.2-t2v-a14b", "tpu-v6e-1")}


def table(path) -> str:
    """The markdown table of docs/plan_big_models.md from the JSON lines in ``path``."""
    gb = lambda n: "-" if n is None else f"{n / 1e9:.1f}"  # noqa: E731
    def ok(r, p):
        return "" if f"{p}_fits" not in r else (" ✓" if r[f"{p}_fits"] else " ✗")

    rows = ["| model, chip (HBM) | changes | text GB | denoise step GB | decode GB | host holds "
            "GB | host→device a step GB | host_s (32 GB/s, assumed) | compute_s | ratio |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if r.get("metric") != "rung":
                continue
            d = r["step"]
            if "error" in d:
                rows.append(f"| {r['config']}, {r['target']} ({r['hbm_bytes'] / 1e9:.0f} GB) "
                            f"| {r['changes']} | {gb(r.get('text_bytes'))}{ok(r, 'text')} "
                            f"| XLA: RESOURCE_EXHAUSTED ✗ | {gb(r.get('decode_bytes'))}"
                            f"{ok(r, 'decode')} | 0 | 0 | - | - | - |")
                continue
            rows.append(
                f"| {r['config']}, {r['target']} ({r['hbm_bytes'] / 1e9:.0f} GB) | {r['changes']} "
                f"| {gb(r.get('text_bytes'))}{ok(r, 'text')} "
                f"| {gb(r.get('denoise_bytes'))}{ok(r, 'denoise')} "
                f"| {gb(r.get('decode_bytes'))}{ok(r, 'decode')} "
                f"| {gb(d['host_argument_bytes'] * r['experts'])} "
                f"| {gb(d['host_to_device_bytes'])} | {d['host_s']:.2f} s | {d['compute_s']:.1f} s "
                f"| {d['host_over_compute']:.3f} |")
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", choices=sorted(CASES))
    ap.add_argument("--table", default=None, metavar="JSONL",
                    help="print the markdown table of these JSON lines and exit")
    ap.add_argument("--layers", type=int, default=None,
                    help="compile this many layers and scale (default: all of them)")
    ap.add_argument("--no-decode", action="store_true")
    ap.add_argument("--out", default=None, help="also append the JSON lines to this file")
    a = ap.parse_args()
    if a.table:
        print(table(a.table))
        return
    if a.case is None:
        ap.error("--case is required (or --table FILE)")

    from ditax.front.run import run_context
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
    for x in lines:
        emit(x, a.out)


if __name__ == "__main__":
    main()
