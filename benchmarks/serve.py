"""``ditax serve`` under load: batching modes, replicas on PostgreSQL, time to ready (JSON lines).

    python benchmarks/serve.py                                  # everything below, the demo model
    python benchmarks/serve.py --part batching --clients 16 --modes static continuous
    python benchmarks/serve.py --part replicas                  # needs PostgreSQL (initdb, pg_ctl)
    python benchmarks/serve.py --part ready
    python benchmarks/serve.py --part batching --uds --model Wan-1.3B-random --size 480x832x81 \
        --steps 4 --max-batch 2 --clients 1 4 16 --override model.dtype=bfloat16   # no TCP

``batching``: for each ``--modes`` value (``off``: every job alone, ``static``: queued jobs of
one shape start and end together, ``continuous``: jobs join the running batch between steps;
``ditax serve --batching``) one server, warmed for the request's shape (``--warm``), then for
each ``--clients`` count N: N clients, each submitting ``--jobs`` jobs one after the other with
exponential think times between them (Poisson arrivals, mean ``--think`` s) and waiting for
each to finish. Reported per (mode, N): videos per minute over the run, p50 / p95 latency
(submit → completed, the store's clock), the mean rows a job ran beside, lost jobs (must be 0;
where not, the row has their final ``statuses``, the first distinct ``errors``, a dead server's
``server_exit``, and the server's log tail goes to stderr), and the server's warm-up as its
``/health`` says (``warm_s``, ``warm_programs``; ``warm_error`` where it failed).

``--model DIR`` serves another pipeline folder (default the demo model; e.g. the random 1.3B
of ``python -m ditax.recipes.random_pipeline``), ``--size HxWxF`` (or ``HxW`` with
``--frames``) and ``--steps`` set the request; jobs take the folder's other sample defaults
(its guidance). ``--uds``: every server listens on a Unix domain socket and the clients talk
HTTP over it (``ditax serve --uds``; machines where TCP, even on the loopback, is closed).

``replicas``: one PostgreSQL server (as the tests start it), then one and then two ``ditax
serve`` replicas on it (``--batching continuous``), clients spread over the replicas;
throughput and latency as above. On a machine with few cores two replicas share them.

``ready``: seconds from starting ``ditax serve --warm SIZE`` to ``/health`` ready, with an
empty compile cache and again with the cache the first start filled.

Medians and ratios: these machines are noisy; every row is one run of one configuration.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import pathlib
import random
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "serve"))
from serve_fixtures import PROMPT, Server  # noqa: E402  (the tests' server runner and client)


def emit(**kw) -> dict:
    print(json.dumps(kw), flush=True)
    return kw


def percentile(values, q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def load(servers: list[Server], body: dict, clients: int, jobs: int, think: float,
         seed0: int) -> dict:
    """``clients`` closed-loop clients with Poisson arrivals (module docstring) against
    ``servers`` (client c submits to server c mod len)."""
    def client(c: int) -> list[dict]:
        rng = random.Random(seed0 + c)
        srv, out = servers[c % len(servers)], []
        for j in range(jobs):
            time.sleep(rng.expovariate(1.0 / think) if think > 0 else 0.0)
            job = None
            try:
                job = srv.submit(seed=seed0 + c * jobs + j, **body)
                out.append(srv.wait(job["id"], timeout=1800, poll=0.25))   # polls cost CPU
            except Exception as e:  # noqa: BLE001 — a server that died or did not answer:
                out.append({"id": job and job["id"], "status": "unanswered",   # in the row
                            "error": {"message": f"client: {type(e).__name__}: {e}"[:500]}})
        return out

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        results = [r for rs in pool.map(client, range(clients)) for r in rs]
    wall = time.perf_counter() - t0
    done = [j for j in results if j["status"] == "completed"]
    latency = [j["seconds_to_finish"] for j in done]
    return {"videos_per_min": round(60 * len(done) / wall, 2),
            "p50_s": round(percentile(latency, 0.5), 3) if latency else None,
            "p95_s": round(percentile(latency, 0.95), 3) if latency else None,
            "p50_queued_s": round(percentile([j["seconds_queued"] for j in done], 0.5), 3)
            if done else None,
            "mean_rows": round(statistics.mean(j["batch_size"] or 1 for j in done), 2)
            if done else None,
            "wall_s": round(wall, 2), "accepted": sum(1 for j in results if j["id"]),
            "lost": len(results) - len(done), **loss(servers, results)}


def loss(servers: list[Server], results: list[dict], first: int = 3) -> dict:
    """What the row says of the jobs that did not complete (nothing when all did): the count
    of each final status (``unanswered``: the client's call failed), the first ``first``
    distinct error messages (the job JSON's ``error.message``, or the client's exception) and
    the exit status of a server that is no longer running; the servers' log tails go to
    stderr (the reason, where the jobs carry none)."""
    lost = [j for j in results if j["status"] != "completed"]
    if not lost:
        return {}
    statuses = dict(collections.Counter(j["status"] for j in results))
    errors: list[str] = []
    for j in lost:
        message = (j.get("error") or {}).get("message")
        if message and message not in errors:
            errors.append(message)
    for srv in servers:
        tail = srv.log.read_text(errors="replace")[-4000:] if srv.log.exists() else "(no log)"
        print(f"serve.py: {len(lost)} job(s) not completed; {srv.log}'s tail:\n{tail}",
              file=sys.stderr, flush=True)
    out = {"statuses": statuses, "errors": [m[:500] for m in errors[:first]]}
    exits = [s.proc.returncode for s in servers if s.proc is not None and s.proc.poll() is not None]
    if exits:
        out["server_exit"] = exits
    return out


def parse_size(text: str) -> tuple[int, int, int | None]:
    """``--size HxWxF`` or ``HxW`` (height first) → (height, width, frames or None)."""
    try:
        dims = [int(v) for v in text.lower().split("x")]
    except ValueError:
        dims = []
    if len(dims) not in (2, 3) or min(dims) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not HEIGHTxWIDTHxFRAMES or "
                                         f"HEIGHTxWIDTH, e.g. 256x256x17")
    return dims[0], dims[1], dims[2] if len(dims) == 3 else None


def body_of(args) -> dict:
    return {"prompt": PROMPT, "size": f"{args.width}x{args.height}",    # the API's WxH
            "num_frames": args.frames, "num_inference_steps": args.steps}


def warm_spec(args) -> str:
    return f"{args.width}x{args.height}x{args.frames}:{args.steps}"     # --warm's WxHxF


def server(args, folder: pathlib.Path, *extra: str, cache) -> Server:
    """A :class:`Server` of ``--model`` (on a Unix socket with ``--uds``)."""
    return Server(folder, *extra, cache=cache, model=args.model, uds=True if args.uds else None)


def server_args(args, mode: str) -> list[str]:
    n = args.clients[-1] * args.jobs + 8
    return ["--batching", mode, "--max-batch", str(args.max_batch), "--max-queue", str(n),
            "--warm", warm_spec(args), *args.override]


def batching(args, base: pathlib.Path) -> list[dict]:
    rows = []
    for mode in args.modes:
        t0 = time.perf_counter()
        srv = server(args, base / f"batching_{mode}", *server_args(args, mode),
                     cache=base / "compile_cache").start(timeout=args.start_timeout)
        warmed = warm_fields(srv)
        # progress on stderr: a run cut by a caller's timeout shows where its time went
        print(f"serve.py: {mode} server ready in {time.perf_counter() - t0:.1f} s "
              f"({json.dumps(warmed)})", file=sys.stderr, flush=True)
        try:
            for n in args.clients:
                rows.append(emit(bench="serve", part="batching", mode=mode, clients=n,
                                 jobs_per_client=args.jobs, think_s=args.think,
                                 max_batch=args.max_batch, **request_fields(args), **warmed,
                                 **load([srv], body_of(args), n, args.jobs, args.think,
                                        1000 * n)))
        finally:
            srv.stop()
    by = {(r["mode"], r["clients"]): r for r in rows}
    for n in args.clients:
        c, s = by.get(("continuous", n)), by.get(("static", n))
        if c and s and s["videos_per_min"]:
            emit(bench="serve", part="batching", ratio="continuous/static", clients=n,
                 throughput=round(c["videos_per_min"] / s["videos_per_min"], 2),
                 p95=round(c["p95_s"] / s["p95_s"], 2) if s["p95_s"] else None)
    return rows


def warm_fields(srv: Server) -> dict:
    """What a started server's ``/health`` says of its warm-up: seconds, programs compiled
    (and read from the compile cache) and, where it failed, why (the server serves all the
    same: its jobs of that size then fail for that reason)."""
    _, _, health = srv.call("GET", "/health")
    out = {"warm_s": health.get("warm_seconds"), "warm_programs": health.get("warm_programs"),
           "warm_cache_hits": health.get("warm_cache_hits")}
    if health.get("warm_error"):
        out["warm_error"] = str(health["warm_error"])[:500]
    return out


def request_fields(args) -> dict:
    """What the rows say about the request (``size`` is the API's WxH, as before)."""
    return dict(model=args.model, size=f"{args.width}x{args.height}", frames=args.frames,
                steps=args.steps, transport="uds" if args.uds else "tcp")


def replicas(args, base: pathlib.Path) -> list[dict]:
    from pg_fixtures import Postgres, pg_bin

    if args.uds:
        return [emit(bench="serve", part="replicas", skipped="--uds: the PostgreSQL store "
                     "needs TCP")]
    if pg_bin() is None:
        return [emit(bench="serve", part="replicas", skipped="no initdb / pg_ctl here")]
    pg = Postgres(pg_bin()).start()
    rows = []
    try:
        n = args.clients[-1]
        for count in (1, 2):
            url = pg.database()
            out = base / f"replicas_{count}" / "videos"     # the replicas' shared folder
            servers = [server(args, base / f"replicas_{count}" / f"r{i}",
                              *server_args(args, "continuous"), cache=base / "compile_cache")
                       for i in range(count)]
            for s in servers:
                s.db, s.out = url, out
            try:
                for s in servers:
                    s.start(timeout=args.start_timeout)
                rows.append(emit(bench="serve", part="replicas", replicas=count, clients=n,
                                 jobs_per_client=args.jobs, think_s=args.think,
                                 **load(servers, body_of(args), n, args.jobs, args.think,
                                        7000 + count)))
            finally:
                for s in servers:
                    s.stop()
    finally:
        pg.stop()
    if len(rows) == 2 and rows[0]["videos_per_min"]:
        emit(bench="serve", part="replicas", ratio="2 replicas / 1",
             throughput=round(rows[1]["videos_per_min"] / rows[0]["videos_per_min"], 2))
    return rows


def ready(args, base: pathlib.Path) -> list[dict]:
    cache = base / "ready_cache"
    shutil.rmtree(cache, ignore_errors=True)
    rows = []
    for which in ("cold", "warm"):
        srv = server(args, base / f"ready_{which}", *server_args(args, "continuous"),
                     cache=cache)
        t0 = time.perf_counter()
        srv.start(timeout=args.start_timeout)
        seconds = time.perf_counter() - t0
        try:
            _, _, health = srv.call("GET", "/health")
            first = srv.wait(srv.submit(seed=1, **body_of(args))["id"])
            second = srv.wait(srv.submit(seed=2, **body_of(args))["id"])
        finally:
            srv.stop()
        rows.append(emit(bench="serve", part="ready", compile_cache=which, **request_fields(args),
                         seconds_to_ready=round(seconds, 2),
                         warm_seconds=health.get("warm_seconds"),
                         first_job_s=first["seconds_to_finish"],
                         first_job_compiles=first["compiles"],
                         second_job_s=second["seconds_to_finish"]))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", nargs="+", choices=("batching", "replicas", "ready"),
                   default=["batching", "replicas", "ready"])
    p.add_argument("--modes", nargs="+", choices=("off", "static", "continuous"),
                   default=["off", "static", "continuous"])
    p.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--jobs", type=int, default=3, help="jobs per client")
    p.add_argument("--think", type=float, default=0.5,
                   help="mean seconds a client waits before its next job (exponential)")
    p.add_argument("--max-batch", type=int, default=16)
    p.add_argument("--model", default="demo",
                   help="pipeline folder the servers serve (default: the demo model)")
    p.add_argument("--size", type=parse_size, default="32x32", metavar="HxWxF",
                   help="request size, height first: HxWxF, or HxW with --frames (32x32)")
    p.add_argument("--frames", type=int, default=5, help="frames when --size has none (5)")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--uds", action="store_true",
                   help="servers on Unix domain sockets, the clients' HTTP over them (no TCP)")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override for every server (repeatable), e.g. "
                        "--override model.dtype=bfloat16")
    p.add_argument("--start-timeout", type=float, default=900.0,
                   help="seconds a server may take to load and warm up (900)")
    p.add_argument("--folder", default=None, help="work folder (default: a temporary one)")
    args = p.parse_args(argv)
    args.height, args.width, frames = args.size
    args.frames = frames or args.frames
    base = pathlib.Path(args.folder or tempfile.mkdtemp(prefix="ditax_serve_bench_"))
    for part in args.part:
        {"batching": batching, "replicas": replicas, "ready": ready}[part](args, base)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
