"""The plan against the chip: for each model row of ``docs/tpu_v5e.jsonl`` with a measured
peak, ``ditax plan CONFIG --target tpu-v5e-1 --compile --latent F,Y,X`` with the row's
overrides (deviceless, on this host), and one JSON line per row: the chip's
``peak_bytes_in_use`` against the plan's buffers (arguments + outputs - aliased + generated
code: :func:`ditax.plan.measure.device_peak`), the plan's temporaries (what the chip's
``peak_bytes_reserved`` reads) and its device peak and "fits" against the chip's limit.

    TPU_SKIP_MDS_QUERY=1 PYTHONPATH=src python benchmarks/plan_vs_chip.py \\
        --out docs/plan_vs_chip.jsonl [--only "1.3B"]

Rows measured before the runtime's split was known (sessions 55 to 57) recorded only
``peak_bytes_in_use`` (the process's peak: the random initialisation's buffers count in it
too): their reserved part is null and said so. A row whose case did not raise the process's
peak (``peak_hbm_at_most``) is compared as a bound only. Identical plans (the same config,
overrides and latent: one case measured in several sessions) compile once.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import re
import sys
from bench_lines import emit

#: a chip row's case (its start) -> the preset it ran (``benchmarks/tpu_chip.py``'s cases)
CONFIGS = {"Wan 2.1 1.3B": "wan2.1-t2v-1.3b", "Wan 2.1 14B": "wan2.1-t2v-14b",
           "Wan 2.1 I2V 14B": "wan2.1-i2v-14b-480p", "FLUX.2-klein-4B": "flux.2-klein-4b",
           "FLUX.1-dev": "flux.1-dev", "FLUX.2-dev": "flux.2-dev", "LTX-2": "ltx-2"}
TARGET = "tpu-v5e-1"
WITHIN = 0.10           # issue 55: the plan within 10 % of the chip
NOT_RECORDED = ("not recorded: the chip row predates recording memory_stats()"
                "['peak_bytes_reserved'] (the executables' temporaries)")


def chip_rows(jsonl: str, only: str | None = None) -> list[dict]:
    """The model rows of ``jsonl`` (``ditax bench``'s forward) with an own or a bounded peak,
    each with ``config`` (the preset) and ``plan_latent`` (F, Y, X) from its case name."""
    out = []
    for line in open(jsonl):
        if not line.strip():
            continue
        r = json.loads(line)
        if r.get("bench") != "ditax_bench" or not (r.get("peak_hbm_bytes")
                                                   or r.get("peak_hbm_at_most")):
            continue
        if only and only not in r["case"]:
            continue
        config = next((c for k, c in CONFIGS.items() if r["case"].startswith(k)), None)
        size = re.search(r"(\d+)x(\d+)(?:x(\d+))?", r["case"])
        if config is None or size is None:
            continue
        h, w, f = int(size[1]), int(size[2]), int(size[3] or 1)
        out.append({**r, "config": config, "size": (f, h, w), "overrides": as_run(r, config)})
    return out


#: the first session whose Wan rows ran the fused attention projections by default
#: (``model.projections=auto``: ``ditax.nn.head_projection``); earlier rows ran XLA's
FUSED_SINCE = 64


def as_run(row: dict, config: str) -> list:
    """A chip row's overrides as the chip ran them: a Wan row from before
    :data:`FUSED_SINCE` that names no ``model.projections`` ran XLA's projections (today's
    ``auto`` would plan the fused kernels: another program)."""
    over = list(row.get("overrides") or [])
    if (config.startswith("wan") and (row.get("session") or 0) < FUSED_SINCE
            and not any(o.startswith("model.projections=") for o in over)):
        over.append("model.projections=xla")
    return over


def plan_json(config: str, overrides, latent) -> dict:
    """``ditax plan config --target tpu-v5e-1 --compile --json --latent F,Y,X overrides``'s
    JSON (in this process: the command's own code path)."""
    from ditax.cli import main

    buf, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        rc = main(["plan", config, "--target", TARGET, "--compile", "--json", "--latent",
                   ",".join(map(str, latent)), *overrides])
    if rc != 0:
        raise RuntimeError(f"ditax plan {config} exited {rc}: {err.getvalue()[-500:]}")
    return json.loads(buf.getvalue())


def latent_of(row: dict) -> tuple[int, int, int]:
    """The plan's ``(F, Y, X)`` for a chip row: its family's latent at the case's size,
    checked against the shape the chip ran (the same number of latent elements)."""
    from ditax.config import load_config
    from ditax.models.base import model_family

    cfg = load_config(row["config"], list(row.get("overrides") or []))
    lat = model_family(cfg.model, cfg.attention).latent_shape(*row["size"])
    if math.prod(lat) != math.prod(row["latent"][1:]):
        raise ValueError(f"{row['case']}: the plan's latent {lat} is not the chip's "
                         f"{row['latent']}")
    return tuple(lat[1:])


def compare(row: dict, fwd: dict) -> dict:
    """One line: the chip's peak (``peak_bytes_in_use``) against the plan's ``forward``. A
    row that records the runtime's two parts (``peak_hbm_how``: session 59 on) keeps its
    in-use peak apart (its ``peak_hbm_bytes`` is in-use + reserved); older rows recorded the
    in-use peak alone as ``peak_hbm_bytes``."""
    chip = row.get("peak_bytes_in_use") if row.get("peak_hbm_how") else row.get(
        "peak_hbm_bytes")
    bound = row.get("peak_hbm_at_most")
    buffers = fwd.get("device_buffer_bytes")
    out = {"bench": "plan_vs_chip", "case": row["case"], "session": row.get("session"),
           "chip_commit": row.get("commit"), "config": row["config"],
           "overrides": row.get("overrides"), "latent": row["latent"], "target": TARGET,
           "chip_peak_bytes_in_use": chip, "chip_peak_at_most": bound,
           "chip_peak_bytes_reserved": row.get("peak_bytes_reserved") if row.get(
               "peak_hbm_how") else (row.get("memory_stats") or {}).get("peak_bytes_reserved"),
           "plan_buffer_bytes": buffers, "plan_temp_bytes": fwd.get("device_temp_bytes"),
           "plan_device_peak_bytes": fwd.get("device_peak_bytes"),
           "plan_argument_bytes": fwd.get("argument_bytes"),
           "plan_output_bytes": fwd.get("output_bytes"),
           "plan_code_bytes": fwd.get("code_bytes"),
           "plan_xla_peak_bytes": fwd.get("peak_bytes"), "plan_fits": fwd.get("fits"),
           "plan_limit_bytes": fwd.get("hbm_capacity_bytes"),
           "plan_suggestion": fwd.get("suggestion"), "plan_error": fwd.get("error"),
           "plan_compile_s": fwd.get("compile_s"), "chip_ran": True}
    if out["chip_peak_bytes_reserved"] is None:
        out["chip_reserved"] = NOT_RECORDED
    elif out["plan_temp_bytes"]:        # the temporaries: what the chip reserved for them
        out["plan_temps_over_chip_reserved"] = round(
            out["plan_temp_bytes"] / out["chip_peak_bytes_reserved"], 4)
    if chip and buffers:
        ratio = buffers / chip
        out.update(metric="plan_buffers_over_chip_peak_bytes_in_use", value=round(ratio, 4),
                   unit="ratio", within_10pct=abs(ratio - 1) <= WITHIN)
    elif bound and buffers:
        out.update(metric="plan_buffers_at_most_chip_bound", value=buffers <= bound,
                   unit="bool", note="the case did not raise the process's peak: only bounded")
    out["fits_agrees"] = out["plan_fits"] is True      # every row here ran on the chip
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chip", default="docs/tpu_v5e.jsonl")
    p.add_argument("--out", default=None, help="append the lines here too")
    p.add_argument("--only", default=None, help="only the rows whose case contains this")
    a = p.parse_args()
    done: dict = {}
    for row in chip_rows(a.chip, a.only):
        key = (row["config"], tuple(row.get("overrides") or ()), tuple(row["latent"]))
        if key not in done:
            done[key] = plan_json(row["config"], row.get("overrides") or [],
                                  latent_of(row))["forward"]
        emit(compare(row, done[key]), a.out)


if __name__ == "__main__":
    sys.path.insert(0, "src")
    main()
