"""Where an empty JAX process's seconds go: the floor under every ditax command's wall.

On the TPU v5e chip an empty process (``import jax``, ``jnp.ones(4) + 1``, exit) took 13.5 and
14.7 s (session 62), against ~1.5 s on the 2-core CPU: the demo model's whole video (23.6 s
on the chip, its phases 3.7 s) is mostly this. Each run here is a fresh child process, timed
from outside (``wall``) and inside (perf_counter marks), one JSON line each::

    {"bench": "process", "case": "empty JAX process, exit=normal", "metric": "wall",
     "value": <median s>, "unit": "s", "phases": {"interpreter": ..., "import": ...,
     "devices": ..., "first_op": ..., "exit": ...}, "times": [...], "backend": "tpu"}

``interpreter``: ``python3 -c pass``'s own wall (the median of the same repeats); ``import``:
``import jax, jax.numpy``; ``devices``: ``jax.devices()`` (opening the runtime); ``first_op``:
the first computation; ``exit``: what is left of the wall after the child's last mark — the
interpreter's shutdown and the runtime's close. ``--exits normal,os_exit``: the second leaves
with ``os._exit(0)`` after flushing (no atexit handlers, no backend teardown), to see how much
of ``exit`` a command could skip once its outputs are written. ``--platform cpu`` runs the
same children with ``JAX_PLATFORMS=cpu`` (the CPU's figures on the same host). On the chip::

    PYTHONPATH=$PWD/src:$PYTHONPATH timeout 200 python3 benchmarks/tpu_process.py --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_lines import emit  # noqa: E402

CHILD = """
import json, os, sys, time
t0 = time.perf_counter()
import jax, jax.numpy as jnp
t1 = time.perf_counter()
devices = jax.devices()
t2 = time.perf_counter()
jax.block_until_ready(jnp.ones(4) + 1)
t3 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "devices": t2 - t1, "first_op": t3 - t2,
                  "backend": devices[0].platform, "device_kind": devices[0].device_kind,
                  "jax": jax.__version__}), flush=True)
sys.stderr.flush()
if sys.argv[1] == "os_exit":
    os._exit(0)
"""


def _run(args: list[str], env: dict, timeout: float) -> tuple[float, str]:
    t0 = time.perf_counter()
    out = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no message"])[-1]
        raise SystemExit(f"tpu_process: child exited {out.returncode}: {last}")
    return wall, out.stdout


def measure(exit_mode: str, repeats: int, env: dict, timeout: float) -> dict:
    """One row: ``repeats`` fresh children leaving by ``exit_mode`` (``normal``/``os_exit``)."""
    bare = statistics.median(_run([sys.executable, "-c", "pass"], env, timeout)[0]
                             for _ in range(repeats))
    walls, inside = [], []
    for _ in range(repeats):
        wall, out = _run([sys.executable, "-c", CHILD, exit_mode], env, timeout)
        walls.append(wall)
        inside.append(json.loads(out.strip().splitlines()[-1]))
    i = walls.index(statistics.median_low(walls))       # the phases of the median run
    marks = {k: inside[i][k] for k in ("import", "devices", "first_op")}
    phases = {"interpreter": round(bare, 3), **{k: round(v, 3) for k, v in marks.items()},
              "exit": round(walls[i] - bare - sum(marks.values()), 3)}
    return {"bench": "process", "case": f"empty JAX process, exit={exit_mode}",
            "metric": "wall", "value": round(statistics.median(walls), 3), "unit": "s",
            "phases": phases, "times": [round(w, 3) for w in walls],
            "backend": inside[i]["backend"], "device_kind": inside[i]["device_kind"],
            "jax": inside[i]["jax"]}


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--exits", default="normal,os_exit")
    ap.add_argument("--platform", default=None, help="JAX_PLATFORMS for the children")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds a child may take")
    ap.add_argument("--out", default=None, help="also append the rows to this JSON-lines file")
    args = ap.parse_args(argv)
    exits = [e.strip() for e in args.exits.split(",") if e.strip()]
    bad = [e for e in exits if e not in ("normal", "os_exit")]
    if bad or args.repeats < 1:
        ap.error(f"--exits {args.exits!r} / --repeats {args.repeats}: exits are normal and "
                 "os_exit, repeats at least 1")
    env = dict(os.environ)
    if args.platform:
        env["JAX_PLATFORMS"] = args.platform
    return [emit(measure(e, args.repeats, env, args.timeout), args.out) for e in exits]


if __name__ == "__main__":
    main()
