"""``ditax serve``: load a model once and serve it over HTTP (:mod:`ditax.serve`).

    ditax serve --model demo --port 8000 --db jobs.sqlite --output-dir videos
    curl -s localhost:8000/v1/videos -d '{"prompt": "a red circle moves right", "seed": 1}'

``POST /v1/videos`` queues a job (checked by ``ditax generate``'s own rules first: a bad
request is a 400 with generate's words), ``GET /v1/videos/ID`` polls it, ``GET
/v1/videos/ID/content`` downloads the mp4 (a PNG for an image model's folder, FLUX.1), ``GET /``
is a web page; see :mod:`ditax.serve.app`.
Jobs live in the SQLite file ``--db``: after a crash the same ``--db`` runs the queued and the
interrupted jobs. Binds 127.0.0.1:8000 unless ``--host`` / ``--port`` say otherwise, or listens on
a Unix domain socket with ``--uds PATH`` (:mod:`ditax.cli.serve_listen`); ``--api-key KEY`` (or
``$DITAX_API_KEY``) makes every route but ``/health`` and the page need ``Authorization: Bearer
KEY``. ``key=value`` overrides as for ``generate`` (mesh, attention, model.dtype, sample.*).
SIGTERM / Ctrl-C (SIGINT) stop the server: it takes no more connections or jobs, and the
running batch has ``--drain`` seconds (10) to finish; past them it goes back to the queue after
the step it is in (queued, progress 0: the next server on the ``--db`` runs it), and the
process says so in one line and exits 0. A second signal ends the drain at once; a third, while
a step still runs, exits without waiting for it (the job is handed back all the same). The
process waits for the worker thread before it exits (at most :data:`STEP_WAIT` seconds past the
drain): jax's thread torn down inside XLA would abort it.
Each job records the model folder and a hash of its files; a server on a folder whose files
changed since (weights replaced) leaves the old files' queued jobs queued and says so.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import time

from ditax.cli import serve_listen as listen
from ditax.cli.serve_group import follower, group_exit, join_group, lead
from ditax.errors import ConfigError
from ditax.serve.group_start import check_mesh, is_group
from ditax.serve.requests import BATCHING, Limits

#: seconds after which a temporary output file in a shared --output-dir is a cut write (a
#: replica starting removes those; its own store's server removes every one)
PARTIAL_AGE = 3600.0
#: seconds past the drain the process waits for the worker's step (or compile) to end before it
#: exits without it, the running jobs handed back to the queue
STEP_WAIT = 300.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="pipeline folder, hub id, 'demo' (the "
                   "shipped Wan demo), 'demo-causal' (its causal student) or 'flux-demo' (the "
                   "shipped small Flux)")
    listen.add_arguments(p)
    p.add_argument("--db", default="ditax_serve/jobs.sqlite",
                   help="SQLite job store (created; reused after a restart), or "
                        "postgresql://USER[:PASSWORD]@HOST:PORT/DB: a PostgreSQL store that "
                        "several replicas share (give them all the same --output-dir, a "
                        "folder every replica sees)")
    p.add_argument("--output-dir", default=None,
                   help="where the mp4s go (default: videos/ beside --db)")
    p.add_argument("--lease", type=float, default=30.0, metavar="SECONDS",
                   help="PostgreSQL --db: a replica holds a job it runs this long past its "
                        "last heartbeat (every SECONDS/3); a dead replica's jobs run elsewhere "
                        "after it (30)")
    p.add_argument("--max-queue", type=int, default=64,
                   help="unfinished jobs accepted before 429 (64)")
    p.add_argument("--max-batch", type=int, default=4,
                   help="jobs of one shape run as one batch, up to this many rows (4)")
    p.add_argument("--batching", choices=BATCHING, default="continuous",
                   help="continuous: jobs join the running batch between two steps and leave "
                        "at their last (default); static: queued jobs of one shape start and "
                        "end together; off: every job alone")
    p.add_argument("--max-wait", type=float, default=10.0, metavar="SECONDS",
                   help="a job of another shape waits at most this long before the running "
                        "batch stops taking new rows, so it runs next (10)")
    p.add_argument("--api-key", default=os.environ.get("DITAX_API_KEY"),
                   help="require 'Authorization: Bearer KEY' (default: $DITAX_API_KEY)")
    p.add_argument("--lora-dir", default=None,
                   help="offer the LoRAs *.safetensors in DIR (by file name without the "
                        "suffix; GET /v1/loras), loaded unmerged: a request's strengths "
                        "switch them without compiling")
    p.add_argument("--max-steps", type=int, default=Limits.max_steps,
                   help=f"most denoising steps one request may ask for "
                        f"({Limits.max_steps}); more is a 400")
    p.add_argument("--max-pixels", type=int, default=Limits.max_pixels,
                   help=f"most pixels (width x height) of one output ({Limits.max_pixels}, "
                        f"2048x2048); more is a 400")
    p.add_argument("--max-frames", type=int, default=Limits.max_frames,
                   help=f"most frames of one video ({Limits.max_frames}); more is a 400")
    p.add_argument("--drain", type=float, default=10.0, metavar="SECONDS",
                   help="on SIGTERM / Ctrl-C, the seconds the running jobs (and open "
                        "requests) may go on to finish; past them the jobs go back to the "
                        "queue after their current step (10; 0: at once)")
    p.add_argument("--warm", type=warm_specs, default=[], metavar="WxHxF[:STEPS],...",
                   help="compile the programs of these request sizes (every batch size) "
                        "after loading, before the first job: WIDTHxHEIGHTxFRAMES, or "
                        "WIDTHxHEIGHT for an image model (a video model: the folder's frames), "
                        "':STEPS' for other than the folder's steps; e.g. 832x480x81,480x832x81."
                        " /health answers 503 'warming' until done")
    p.add_argument("--process-timeout", type=float, default=15.0, metavar="SECONDS",
                   help="one model across processes (mesh.num_processes=N mesh.process_id=K "
                        "mesh.coordinator_address=HOST:PORT, process 0 serves HTTP): a process "
                        "silent this long counts as lost and the group exits 1 for its "
                        "supervisor to restart it (15)")
    p.add_argument("--no-progress", action="store_true", help="hide the loading status line")
    p.add_argument("overrides", nargs="*", default=[], metavar="key=value",
                   help="config overrides, as for ditax generate")


def warm_specs(text: str) -> list[str]:
    """argparse type of ``--warm`` (:func:`ditax.serve.warm.parse_specs`; imported late:
    the serve extra may be missing)."""
    from ditax.serve.warm import parse_specs

    try:
        return parse_specs(text)
    except ValueError as e:      # its message, as argparse shows a type's error
        raise argparse.ArgumentTypeError(str(e)) from None


def lora_files(lora_dir) -> list[tuple[str, str]]:
    """``[(name, file)]`` of the ``*.safetensors`` directly in ``lora_dir`` (sorted)."""
    if lora_dir is None:
        return []
    folder = pathlib.Path(lora_dir)
    if not folder.is_dir():
        raise ConfigError(f"--lora-dir {lora_dir} is not a folder; give the folder of the "
                          f"LoRA .safetensors files")
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"--lora-dir {lora_dir} has no .safetensors files")
    return [(f.stem, str(f)) for f in files]


def check_args(args) -> None:
    listen.address_args(args)
    for flag, v in (("--max-queue", args.max_queue), ("--max-batch", args.max_batch),
                    ("--max-steps", args.max_steps), ("--max-pixels", args.max_pixels),
                    ("--max-frames", args.max_frames)):
        if v < 1:
            raise ConfigError(f"{flag}={v} must be >= 1")
    if not 0 <= args.max_wait < float("inf"):
        raise ConfigError(f"--max-wait={args.max_wait} must be a finite number of seconds >= 0, "
                          f"e.g. --max-wait 10 (0: another shape's job runs as soon as the "
                          f"running rows end)")
    if not 0 < args.process_timeout < float("inf"):      # NaN too
        raise ConfigError(f"--process-timeout={args.process_timeout} must be a finite number "
                          f"of seconds > 0, e.g. --process-timeout 15")
    if not 0 <= args.drain < float("inf"):      # NaN too
        raise ConfigError(f"--drain={args.drain} must be a finite number of seconds >= 0, e.g. "
                          f"--drain 10 (0: hand the running jobs back at the next step)")
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise ConfigError(f"ditax serve needs FastAPI and uvicorn ({e}); install them with "
                          f"pip install 'ditax[serve]'") from None


def run(args) -> int:
    check_args(args)
    from ditax.cli import model_arg
    from ditax.front.folder import folder_request
    from ditax.serve.requests import BadRequest, check_body

    from ditax.serve.jobs import check_store_path
    from ditax.serve.model_hash import folder_hash
    from ditax.serve.stores import open_store
    from ditax.serve.pgpool import mask_url

    if not 0 < args.lease < float("inf"):       # NaN too
        raise ConfigError(f"--lease={args.lease} must be a finite number of seconds > 0, e.g. "
                          f"--lease 30 (how long a replica holds a job past its heartbeat)")
    args.model = model_arg(args.model)
    req = folder_request(args.model, args.overrides)   # the folder, before anything heavy
    loras = lora_files(args.lora_dir)
    if is_group(req.cfg.mesh):           # one model across processes (ditax.serve.group)
        check_mesh(req.cfg.mesh)
        if req.cfg.mesh.process_id != 0:
            return follower(args, req, loras)   # no store, no port: the leader's turns
    db = check_store_path(args.db)
    shared = isinstance(db, str)                 # a PostgreSQL URL: replicas share it
    if shared and not args.output_dir:
        raise ConfigError(f"--db {mask_url(db)} is a database URL that replicas share: give "
                          f"them all the same --output-dir, a folder each replica sees (e.g. "
                          f"--output-dir /shared/ditax_videos)")
    from ditax.io.remote.urls import resolve   # the one rule for paths and URLs

    given_out = (resolve(args.output_dir, "--output-dir", error=ConfigError, remote=False)
                 if args.output_dir else None)
    listen.check_address(args)
    pipelines = req.pipelines
    # the store (a SQLite file's one server; PostgreSQL: one of its replicas), its jobs this
    # model's, before the model loads
    store = open_store(db, model=str(pathlib.Path(req.root).resolve()),
                       model_hash=folder_hash(req.root), lease=args.lease)
    store.own()
    out = given_out or db.parent / "videos"
    out.mkdir(parents=True, exist_ok=True)
    limits = Limits(max_steps=args.max_steps, max_pixels=args.max_pixels,
                    max_frames=args.max_frames)
    # the other processes join (jax.distributed) before the first jax call: the checks below
    # count the devices of every process
    group = join_group(args, req, loras) if is_group(req.cfg.mesh) else None
    with group_exit(group):
        try:       # the model folder, overrides and LoRAs, checked as generate checks them
            load = check_body({"prompt": "a check of the server's settings"}, args.model,
                              args.overrides, str(out / "request.mp4"), limits,
                              loras=tuple(n for n, _ in loras),
                              lora_files=tuple(f for _, f in loras), pipelines=pipelines,
                              startup=True).load
        except BadRequest as e:
            raise ConfigError(str(e)) from None
        serve(args, store, out, load, loras, limits, pipelines, group=group)
    return 0


def serve(args, store, out: pathlib.Path, load, loras: list,
          limits: Limits = Limits(), pipelines=None, group=None) -> None:
    """Load the model once (``load``: its :class:`~ditax.front.LoadRequest`), recover the
    store (``store``: owned by this process), bind the port, then start the worker and run
    uvicorn until SIGTERM / SIGINT (``limits``: what a request may ask; ``pipelines``: the folder's family,
    whose request fields ``/health`` lists for the page; ``group``: the leader's side of a
    model served by several processes, :mod:`ditax.serve.group`)."""
    from ditax.pipelines.request import fields_of
    from ditax.serve.requests import HTTP_FIELDS

    import jax
    import uvicorn

    import ditax
    from ditax.front.run import run_context
    from ditax.serve import warm
    from ditax.serve.app import ServeState, create_app
    from ditax.serve.group import SettledStore
    from ditax.serve.group_follow import leader_worker
    from ditax.serve.requests import check_body
    from ditax.serve.worker import Worker

    cache, makes = load.compile_cache, load.makes
    # --warm's sizes, each checked as its POST would be, before anything loads
    warming = warm.warm_requests(getattr(args, "warm", None) or [], makes, lambda body: (
        check_body(body, args.model, args.overrides, str(out / "request.mp4"), limits,
                   tuple(n for n, _ in loras), (), makes, pipelines)))
    mesh = load.make_mesh()
    db = store.path
    sock = listen.listen(args)     # a port (socket) in use ends here, before any claim
    requeued, failed = store.recover()       # this process owns the store: their owner is gone
    # a write cut by a kill is never served; on a folder replicas share, another replica may be
    # writing one now: only those an hour old go
    from ditax.serve.jobs import JobStore

    shared = not isinstance(store, JobStore)       # PostgreSQL: replicas share the folder
    for partial in out.glob("*.partial*"):
        with contextlib.suppress(OSError):
            if not shared or time.time() - partial.stat().st_mtime > PARTIAL_AGE:
                partial.unlink(missing_ok=True)
    with run_context(load.attention, mesh, compile_cache=cache, status=not args.no_progress,
                     precision=load.precision) as folder:
        path = load.path
        pipe = ditax.load_pipeline(path, mesh=mesh, **load.kwargs())
        print(f"compile cache: {folder or 'off'}; loaded {path} in {pipe.load_time:.1f}s")
        if requeued or failed:
            print(f"recovered {db}: {len(requeued)} interrupted job(s) queued again, "
                  f"{len(failed)} failed (interrupted too often)")
        # in a group, a failure that a lost process caused fails no job (it runs again), and
        # the followers run the warm-up too
        make = Worker if group is None else leader_worker
        worker = make(pipe, store if group is None else SettledStore(store, group), out,
                      max_batch=args.max_batch, drain=args.drain,
                      batching=args.batching, max_wait=args.max_wait,
                      say=lambda line: print(line, flush=True),
                      context=lambda: run_context(load.attention, mesh,
                                                  precision=load.precision,
                                                  compile_cache=cache), group=group)
        devices = jax.devices()
        state = ServeState(model=path, overrides=list(args.overrides),
                           store=store,
                           worker=worker, output_dir=out, max_queue=args.max_queue,
                           max_batch=args.max_batch, api_key=args.api_key, loras=loras,
                           makes=makes, limits=limits,
                           outputs=tuple(o for o in pipelines.outputs if o not in pipelines.muxed),
                           warm=warming, say=lambda line: print(line, flush=True),
                           health={"model": str(path), "platform": devices[0].platform,
                                   "devices": len(devices), "makes": makes,
                                   "fields": [f.api for f in fields_of(pipelines) if f.api]
                                   + [k for k in HTTP_FIELDS if takes(pipelines, k)]})
        if group is not None:
            state.health.update(group.health())
        app = create_app(state)
        if store.others():
            print(f"{store.others()} queued job(s) in {db} are another model's; they stay "
                  f"queued for it (this server runs {path}'s)")
        changed = store.changed()
        if changed:
            print(f"{sum(changed.values())} queued job(s) in {db} were submitted to "
                  f"{store.model} when its files were different (folder hash "
                  f"{', '.join(sorted(changed))}, now {store.model_hash}: weights or configs "
                  f"replaced); they stay queued for those files — put them back to run the "
                  f"jobs, or cancel them (DELETE /v1/videos/ID)")
        print(f"serving {path} on {listen.where(args, sock)} (jobs: {db}, videos: {out})",
              flush=True)
        server = stopping_server(uvicorn, worker)(uvicorn.Config(
            app, **listen.uvicorn_address(args, sock), log_level="warning",
            # open requests (a download) get the drain too, at least a second
            timeout_graceful_shutdown=max(args.drain, 1.0)))
        if group is not None:
            lead(group, state, server, store)
        with server.signals():                # until the worker has ended, not just uvicorn
            server.run(sockets=[sock])
            wait_for(worker, store, server.forced)
            warm.finish(state, args.drain, server.forced, store)    # a warm-up still compiling
            wait_for(worker, store, server.forced)   # one it started as the stop began
    listen.close(args, sock)
    store.close()
    print(f"stopped; queued jobs stay in {db} (the same --db runs them)", flush=True)


def takes(pipelines, field: str) -> bool:
    """Whether the served family takes HTTP field ``field``: the images only where its
    pipelines read them, ``cache`` only with the step-cache capability."""
    from ditax.models.registry import spec

    if field in ("image", "last_image"):
        return field in pipelines.cli_inputs
    return field != "cache" or spec(pipelines.name).has("step_cache")


def stopping_server(uvicorn, worker):
    """uvicorn's ``Server``, whose SIGTERM / SIGINT also stop ``worker``: the first begins the
    drain (:meth:`~ditax.serve.worker.Worker.begin_stop`) and stops uvicorn, a second ends the
    drain (:meth:`~ditax.serve.worker.Worker.hurry`), a later one, once the drain is over, sets
    ``forced`` (exit without waiting for the running step). The handlers stay from
    :meth:`signals` until its end, so they cover the wait for the worker after uvicorn has
    shut down, and no signal is raised again: the jobs are safe in the store, the exit status
    is 0. uvicorn's own second-signal exit is not used: it skips the app's shutdown and leaves
    the worker running into the interpreter's end."""
    import contextlib
    import signal
    import threading

    class Server(uvicorn.Server):
        forced = threading.Event()

        def handle_exit(self, sig, frame) -> None:
            if not worker.stopping:
                worker.begin_stop()
            elif not worker.overdue():
                worker.hurry()
            else:
                self.forced.set()
            self.should_exit = True

        @contextlib.contextmanager
        def capture_signals(self):        # signals() holds them
            yield

        @contextlib.contextmanager
        def signals(self):
            old = {s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT,
                                                                    signal.SIGTERM)}
            try:
                yield
            finally:
                for s, handler in old.items():
                    signal.signal(s, handler)

    return Server


def wait_for(worker, store, forced) -> None:
    """Stop ``worker`` (its drain, if no signal began it) and wait for its thread to end: at
    most :data:`STEP_WAIT` seconds past the drain, less if ``forced`` is set. A thread still in
    a step then (one long XLA call cannot be interrupted) would abort the interpreter at its
    end, so the running jobs are handed back from here and the process ends at once
    (``os._exit(0)``, the output flushed; the store's transactions are committed)."""
    import os
    import sys
    import time

    worker.begin_stop()
    worker.wake.set()                     # an idle worker ends at once
    told = False
    while worker.is_alive() and not forced.is_set() \
            and time.monotonic() < worker.deadline + STEP_WAIT:
        if not told and time.monotonic() > worker.deadline + 5 and worker.running:
            told = True
            print(f"stopping: waiting up to {STEP_WAIT:g} s for the step of "
                  f"{', '.join(worker.running)} to end (signal again to exit without it)",
                  flush=True)
        worker.join(0.1)
    if not worker.is_alive():
        return
    back = [i for i in list(worker.running) if store.requeue(i)]
    waited = time.monotonic() - worker.deadline
    print((worker.handed_back(back) if back else "stopping: no job running")
          + f"; its step had not ended {waited:.0f} s after the drain, so the process exits "
          f"without it", flush=True)
    sys.stderr.flush()
    os._exit(0)
