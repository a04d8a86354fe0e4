"""``ditax serve``: load a model once and serve it over HTTP (:mod:`ditax.serve`).

    ditax serve --model demo --port 8000 --db jobs.sqlite --output-dir videos
    curl -s localhost:8000/v1/videos -d '{"prompt": "a red circle moves right", "seed": 1}'

``POST /v1/videos`` queues a job (checked by ``ditax generate``'s own rules first: a bad
request is a 400 with generate's words), ``GET /v1/videos/ID`` polls it, ``GET
/v1/videos/ID/content`` downloads the mp4 (a PNG for an image model's folder, FLUX.1), ``GET /``
is a web page; see :mod:`ditax.serve.app`.
Jobs live in the SQLite file ``--db``: after a crash the same ``--db`` runs the queued and the
interrupted jobs. Binds 127.0.0.1 unless ``--host`` says otherwise; ``--api-key KEY`` (or
``$DITAX_API_KEY``) makes every route but ``/health`` and the page need ``Authorization: Bearer
KEY``. ``key=value`` overrides as for ``generate`` (mesh, attention, model.dtype, sample.*).
SIGTERM / Ctrl-C stop at the next step and put the running jobs back in the queue.
"""

from __future__ import annotations

import argparse
import os
import pathlib

from ditax.errors import ConfigError
from ditax.serve.requests import Limits


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="pipeline folder, hub id, 'demo' (the "
                   "shipped Wan demo) or 'flux-demo' (the shipped small Flux)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--db", default="ditax_serve/jobs.sqlite",
                   help="SQLite job store (created; reused after a restart)")
    p.add_argument("--output-dir", default=None,
                   help="where the mp4s go (default: videos/ beside --db)")
    p.add_argument("--max-queue", type=int, default=64,
                   help="unfinished jobs accepted before 429 (64)")
    p.add_argument("--max-batch", type=int, default=4,
                   help="queued jobs of one shape run as one batch, up to this many (4)")
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
    p.add_argument("--no-progress", action="store_true", help="hide the loading status line")
    p.add_argument("overrides", nargs="*", default=[], metavar="key=value",
                   help="config overrides, as for ditax generate")


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


def check_host(host: str, port: int) -> None:
    """``--host`` resolves to an address to bind (one line otherwise, before the model
    loads)."""
    import socket

    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        raise ConfigError(f"--host {host!r} does not resolve ({e}); give an address of this "
                          f"machine, e.g. --host 127.0.0.1 (or 0.0.0.0 for every interface)") \
            from None


def check_args(args) -> None:
    for flag, v, lo in (("--port", args.port, 0), ("--max-queue", args.max_queue, 1),
                        ("--max-batch", args.max_batch, 1), ("--max-steps", args.max_steps, 1),
                        ("--max-pixels", args.max_pixels, 1),
                        ("--max-frames", args.max_frames, 1)):
        if v < lo or (flag == "--port" and v > 65535):
            raise ConfigError(f"{flag}={v} must be >= {lo}" + (" and <= 65535"
                                                               if flag == "--port" else ""))
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise ConfigError(f"ditax serve needs FastAPI and uvicorn ({e}); install them with "
                          f"pip install 'ditax[serve]'") from None


def run(args) -> int:
    check_args(args)
    from ditax.cli import model_arg
    from ditax.cli.generate import parse_request
    from ditax.cli.sample_request import sample_request
    from ditax.serve.requests import BadRequest, check_body

    from ditax.serve.jobs import JobStore, check_store_path

    db = check_store_path(args.db)
    check_host(args.host, args.port)
    args.model = model_arg(args.model)
    req = sample_request(args.model, args.overrides)   # the folder, before anything heavy
    pipelines = req.pipelines
    # the store's one server, its jobs this model's, before the model loads
    store = JobStore(db, model=str(pathlib.Path(req.root).resolve()))
    store.own()
    out = pathlib.Path(args.output_dir) if args.output_dir else db.parent / "videos"
    out.mkdir(parents=True, exist_ok=True)
    loras = lora_files(args.lora_dir)
    limits = Limits(max_steps=args.max_steps, max_pixels=args.max_pixels,
                    max_frames=args.max_frames)
    try:           # the model folder, overrides and LoRAs, checked as generate checks them
        load = dict(check_body({"prompt": "a check of the server's settings"}, args.model,
                               args.overrides, str(out / "request.mp4"), parse_request,
                               limits, loras=tuple(n for n, _ in loras),
                               lora_files=tuple(f for _, f in loras),
                               pipelines=pipelines, startup=True).load)
    except BadRequest as e:
        raise ConfigError(str(e)) from None
    serve(args, store, out, load, loras, limits, pipelines)
    return 0


def serve(args, store, out: pathlib.Path, load: dict, loras: list,
          limits: Limits = Limits(), pipelines=None) -> None:
    """Load the model once (``load``: generate's load arguments), recover the store (``store``:
    owned by this process), bind the port, then start the worker and run uvicorn until
    SIGTERM / SIGINT (``limits``: what a request may ask; ``pipelines``: the folder's family,
    whose request fields ``/health`` lists for the page)."""
    from ditax.pipelines.request import fields_of
    from ditax.serve.requests import HTTP_FIELDS

    import jax
    import uvicorn

    import ditax
    from ditax.cli.generate import parse_request
    from ditax.cli.run import run_context
    from ditax.serve.app import ServeState, create_app
    from ditax.serve.worker import Worker

    mesh_cfg, cache = load.pop("mesh_config"), load.pop("compile_cache")
    makes = load.pop("makes", "video")
    mesh = None if mesh_cfg is None else ditax.make_mesh(mesh_cfg)
    db = store.path
    sock = bind(args.host, args.port)        # a port in use ends here, before any claim
    requeued, failed = store.recover()       # this process owns the store: their owner is gone
    for partial in out.glob("*.partial*"):        # a write cut by a kill: never served
        partial.unlink(missing_ok=True)
    with run_context(load["attention"], mesh, compile_cache=cache,
                     status=not args.no_progress) as folder:
        path = load.pop("path")
        pipe = ditax.load_pipeline(path, mesh=mesh, **load)
        print(f"compile cache: {folder or 'off'}; loaded {path} in {pipe.load_time:.1f}s")
        if requeued or failed:
            print(f"recovered {db}: {len(requeued)} interrupted job(s) queued again, "
                  f"{len(failed)} failed (interrupted too often)")
        worker = Worker(pipe, store, out, max_batch=args.max_batch,
                        context=lambda: run_context(load["attention"], mesh,
                                                    compile_cache=cache))
        devices = jax.devices()
        state = ServeState(model=path, overrides=list(args.overrides),
                           parse_request=parse_request, store=store,
                           worker=worker, output_dir=out, max_queue=args.max_queue,
                           max_batch=args.max_batch, api_key=args.api_key, loras=loras,
                           makes=makes, limits=limits, outputs=tuple(pipelines.outputs),
                           health={"model": str(path), "platform": devices[0].platform,
                                   "devices": len(devices), "makes": makes,
                                   "fields": [f.api for f in fields_of(pipelines) if f.api]
                                   + [k for k in HTTP_FIELDS if takes(pipelines, k)]})
        app = create_app(state)
        if store.others():
            print(f"{store.others()} queued job(s) in {db} are another model's; they stay "
                  f"queued for it (this server runs {path}'s)")
        port = sock.getsockname()[1]          # --port 0: the one the system chose
        print(f"serving {path} on http://{args.host}:{port} (jobs: {db}, videos: {out})",
              flush=True)
        quiet_exit_server(uvicorn)(uvicorn.Config(
            app, host=args.host, port=port, log_level="warning",
            timeout_graceful_shutdown=30)).run(sockets=[sock])
    store.close()
    print(f"stopped; queued jobs stay in {db} (the same --db runs them)", flush=True)


def bind(host: str, port: int):
    """A listening-ready socket bound to ``host:port`` (one :class:`ConfigError` line when
    the port is taken or the address is not this machine's)."""
    import socket

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET,
                         socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ConfigError(f"--host {host} --port {port}: cannot listen there ({e.strerror or e});"
                          f" choose a free --port (0: any) or an address of this machine") \
            from None
    return sock


def takes(pipelines, field: str) -> bool:
    """Whether the served family takes HTTP field ``field``: the images only where its
    pipelines read them, ``cache`` only with the step-cache capability."""
    from ditax.models.registry import spec

    if field in ("image", "last_image"):
        return field in pipelines.cli_inputs
    return field != "cache" or spec(pipelines.name).has("step_cache")


def quiet_exit_server(uvicorn):
    """uvicorn's ``Server``, except that the SIGTERM / SIGINT that stopped it is not raised
    again once it has shut down: the jobs are safe in the store, so the exit status is 0."""
    import contextlib
    import signal

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):
            old = {s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT,
                                                                    signal.SIGTERM)}
            try:
                yield
            finally:
                for s, handler in old.items():
                    signal.signal(s, handler)

    return Server
