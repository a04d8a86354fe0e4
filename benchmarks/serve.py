"""``ditax serve`` under load: N clients × M jobs against the demo model, one JSON line a run.

    python benchmarks/serve.py --clients 4 --jobs 4 --max-batch 4 1

For each ``--max-batch`` value a fresh server (its own job store, a persistent compile cache
shared by the runs, so the second run reads what the first compiled) is started; one job
measures the first job (compile included) against a second of the same shape; then two bursts,
each client submitting its jobs at once and polling them to the end: ``cold_*`` the first (the
batch sizes compile there), the rest the second. Printed: videos per minute over a burst, p50 /
p95 latency from submit to completed, the batch sizes the server chose, the first job's seconds
vs the second's, and how many accepted jobs did not complete (``lost``: must be 0).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import pathlib
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "serve"))
from serve_fixtures import PROMPT, Server  # noqa: E402  (the tests' server runner and client)


def percentile(values, q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def burst(srv, body: dict, args, seed0: int) -> dict:
    """Every client submits its jobs at once and polls them to the end."""
    def client(c: int) -> list[dict]:
        ids = [srv.submit(seed=seed0 + c * args.jobs + j, **body)["id"] for j in range(args.jobs)]
        return [srv.wait(i, timeout=900, poll=0.02) for i in ids]

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
        results = [r for rs in pool.map(client, range(args.clients)) for r in rs]
    wall = time.perf_counter() - t0
    done = [job for job in results if job["status"] == "completed"]
    latency = [job["seconds_to_finish"] for job in done]        # submit -> completed
    return {"videos_per_min": round(60 * len(done) / wall, 2),
            "p50_s": round(percentile(latency, 0.5), 3) if latency else None,
            "p95_s": round(percentile(latency, 0.95), 3) if latency else None,
            "batch_sizes": sorted({job["batch_size"] for job in done}),
            "accepted": len(results), "lost": len(results) - len(done)}


def one_run(folder: pathlib.Path, cache: pathlib.Path, max_batch: int, args) -> dict:
    body = {"prompt": PROMPT, "size": args.size, "num_frames": args.frames,
            "num_inference_steps": args.steps}
    srv = Server(folder, "--max-batch", str(max_batch), "--max-queue",
                 str(args.clients * args.jobs + 8), cache=cache).start()
    try:
        t0 = time.perf_counter()
        first = srv.wait(srv.submit(seed=0, **body)["id"])
        t_first = time.perf_counter() - t0
        t0 = time.perf_counter()
        second = srv.wait(srv.submit(seed=1, **body)["id"])
        t_second = time.perf_counter() - t0

        cold = burst(srv, body, args, 1000)     # new batch sizes compile here
        warm = burst(srv, body, args, 5000)     # every program already there
        _, _, metrics = srv.call("GET", "/metrics")
    finally:
        srv.stop()
    compiles = [ln for ln in metrics.decode().splitlines() if ln.startswith("ditax_compiles_total")]
    return {"bench": "serve", "max_batch": max_batch, "clients": args.clients,
            "jobs_per_client": args.jobs, "size": args.size, "frames": args.frames,
            "steps": args.steps, **warm, **{f"cold_{k}": v for k, v in cold.items()
                                            if k in ("videos_per_min", "p50_s", "p95_s")},
            "first_job_s": round(t_first, 3), "first_job_compiles": first["compiles"],
            "second_job_s": round(t_second, 3), "second_job_compiles": second["compiles"],
            "compiles_total": int(compiles[0].split()[-1]) if compiles else None,
            "accepted": warm["accepted"] + cold["accepted"], "lost": warm["lost"] + cold["lost"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--jobs", type=int, default=4, help="jobs per client")
    p.add_argument("--size", default="64x64", help="WxH (the demo model's own: 64x64)")
    p.add_argument("--frames", type=int, default=17)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--max-batch", type=int, nargs="+", default=[4, 1])
    p.add_argument("--folder", default=None, help="work folder (default: a temporary one)")
    args = p.parse_args(argv)
    base = pathlib.Path(args.folder or tempfile.mkdtemp(prefix="ditax_serve_bench_"))
    for mb in args.max_batch:
        rec = one_run(base / f"max_batch_{mb}", base / "compile_cache", mb, args)
        print(json.dumps(rec), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
