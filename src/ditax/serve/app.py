"""The HTTP API of ``ditax serve`` (FastAPI): OpenAI-style ``/v1/videos`` jobs, health, metrics,
the web page.

Routes (JSON unless said; every error, a refused query parameter or an unknown route
included, is ``{"error": {"message", "param", "type"}}``):

- ``POST /v1/videos`` — body of :mod:`ditax.serve.requests` → ``200`` the queued job; ``400``
  a request ``ditax generate`` would refuse (its words), ``413`` over a limit, ``429`` with
  ``Retry-After`` when ``max_queue`` jobs wait;
- ``GET /v1/videos/{id}`` — the job: ``status`` queued | in_progress | completed | failed |
  cancelled, ``progress`` 0-100 (steps done), ``error.message`` when failed, the request;
- ``GET /v1/videos/{id}/content`` — ``video/mp4`` once completed (404 before, with a message);
  ``?variant=KIND``: a further output of the family (``PipelineFamily.outputs``, a ``.npy``);
  ``image/png`` when the served folder is an image model (FLUX.1: the same job routes answer
  it — its jobs have ``"object": "image"``, no ``num_frames``; their fields are ``ditax
  generate``'s for a PNG, so ``num_frames``, ``image``, ``negative_prompt`` get a 400 with its
  words);
- ``GET /v1/videos/{id}/events`` — ``text/event-stream`` (Server-Sent Events): one event
  (``data:`` the job's JSON) at once and at each change of its status or progress, read from
  the store (so any server on a shared store answers it), the last one at completed, failed or
  cancelled, after which the stream ends (a causal model's job: also one event per finished
  chunk, ``chunk: {index, frames, first, count, url}``, before the end; ``GET url``
  (``/v1/videos/{id}/chunks/{index}``): the chunk's frames, one ``image/jpeg`` of ``count``
  frames stacked top to bottom, :mod:`ditax.serve.chunks`); a comment line every 15 s keeps
  proxies from closing a quiet stream. With an API key it takes ``?key=KEY`` instead of the header (a browser's
  ``EventSource`` sends no headers; this is the only route that does);
- ``GET /v1/videos?limit=&after=`` — newest first (``after``: the last id of the previous page);
  each job as what it is (``object`` video / image, its ``model``), whichever model submitted it
  to a store that servers of several models used over time;
- ``DELETE /v1/videos/{id}`` — cancels a queued or running job; a finished one's file is
  deleted (the record stays);
- ``GET /v1/loras`` — the LoRAs of ``--lora-dir`` (a request names them in ``loras`` with a
  strength; unmerged, so switching compiles nothing);
- ``GET /health`` (model, platform, devices, ``queue_depth``: the queued jobs this server can
  run, ``queued_for_others``: those left for another model or its files before they changed;
  ``ready``; never needs the key):
  ``503`` with ``"status": "warming"`` while ``--warm`` compiles (:mod:`ditax.serve.warm`),
  ``503`` ``"worker stopped"`` if the worker died; ``GET /metrics`` (Prometheus text,
  :mod:`ditax.serve.metrics`), ``GET /`` the page (``static/``; page and scripts need no key,
  the API calls they make do).

With an API key every other route needs ``Authorization: Bearer KEY`` (401 otherwise).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
import pathlib
import re
import threading
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import (FileResponse, JSONResponse, PlainTextResponse, Response,
                               StreamingResponse)
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from ditax.io.outputs import extra_path
from ditax.serve import warm
from ditax.serve.chunks import chunk_frames
from ditax.serve.jobs import FINISHED, JobStore, QueueFull
from ditax.serve.metrics import Metrics, metrics_text
from ditax.serve.requests import BadRequest, Limits, check_body
from ditax.serve.worker import Worker

STATIC = pathlib.Path(__file__).parent / "static"
_ID = re.compile(r"video_[0-9a-f]{32}")
_EVENTS = re.compile(r"/v1/videos/[^/]+/events")
OPEN_PATHS = ("/health", "/", "/static/")
EVENT_POLL = 0.2          # seconds between two reads of a job an event stream follows
KEEP_ALIVE = 15.0         # seconds of silence before an event stream sends a comment line


@dataclass
class ServeState:
    """What the routes share: the served model (path and overrides), the store, the worker,
    limits and settings."""

    model: str
    overrides: list
    store: JobStore
    worker: Worker
    output_dir: pathlib.Path
    max_queue: int = 64
    max_batch: int = 4
    api_key: str | None = None
    limits: Limits = field(default_factory=Limits)
    health: dict = field(default_factory=dict)
    loras: list = field(default_factory=list)      # [(name, file)] of --lora-dir, in order
    makes: str = "video"                           # or "image" (the folder family's makes)
    outputs: tuple = ()                            # its further outputs (GET ...?variant=)
    warm: list = field(default_factory=list)       # [(spec, stored request)] of --warm
    say: object = print                            # where the server's lines go
    # set by ditax.serve.warm.start: False while the warm-up compiles (the worker not started)
    ready: bool = field(default=False, init=False)
    warming: threading.Thread | None = field(default=None, init=False)
    warm_seconds: float | None = field(default=None, init=False)
    warm_programs: int = field(default=0, init=False)
    warm_cache_hits: int = field(default=0, init=False)
    warm_error: str | None = field(default=None, init=False)

    def __post_init__(self):
        self.ready = not self.warm

    @property
    def metrics(self) -> Metrics:
        return self.worker.metrics


def error(status: int, message: str, param: str | None = None, headers=None):
    """The API's one error body, ``{"error": {"message", "param", "type"}}``."""
    kind = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found",
            405: "method_not_allowed", 413: "request_too_large",
            429: "queue_full"}.get(status, "server_error")
    return JSONResponse({"error": {"message": message, "param": param, "type": kind}},
                        status_code=status, headers=headers)


def job_kind(job: dict) -> str:
    """A job's output kind, as it was submitted (``video`` / ``image``): the row's own; a row
    of a store written before jobs kept it is a video when its request has frames."""
    return job.get("kind") or ("video" if "num_frames" in job["request"] else "image")


def job_json(job: dict) -> dict:
    """The API view of a job row: the object its own kind (:func:`job_kind`, whichever model
    the server now serves), its model (the folder it was submitted to)."""
    req = {k: v for k, v in job["request"].items() if k not in ("image", "last_image")}
    out = {"id": job["id"], "object": job_kind(job), "model": job.get("model"),
           "status": job["status"],
           "progress": job["progress"], "created_at": int(job["created_at"]),
           "completed_at": None if job["finished_at"] is None else int(job["finished_at"]),
           "error": None if not job["error"] else {"message": job["error"]},
           "size": f"{req['width']}x{req['height']}", **req,
           "has_image": "image" in job["request"], "attempts": job["attempts"],
           "batch_size": job["batch_size"], "compiles": job["compiles"],
           "seconds_to_finish": None if job["seconds"] is None else round(job["seconds"], 3),
           # from submitted to claimed by a server (its last attempt's start)
           "seconds_queued": None if job.get("started_at") is None
           else round(job["started_at"] - job["created_at"], 3),
           "warnings": json.loads(job["warnings"]) if job.get("warnings") else []}
    if job["status"] == "completed" and job["file"]:
        out["url"] = f"/v1/videos/{job['id']}/content"
    return out


def create_app(state: ServeState):
    """The FastAPI application over ``state``: the worker starts with it (after the warm-up
    of ``state.warm``, :func:`ditax.serve.warm.start`) and begins to stop with it
    (:meth:`~ditax.serve.worker.Worker.begin_stop`; whoever runs the app joins it, and the
    warm-up: :func:`ditax.serve.warm.finish`)."""
    import contextlib

    @contextlib.asynccontextmanager
    async def lifespan(app):
        warm.start(state)
        yield
        state.worker.begin_stop()     # the process joins it (ditax.cli.serve)

    app = FastAPI(title="ditax serve", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.middleware("http")
    async def auth(request: Request, call_next):
        path = request.url.path
        if state.api_key and not (path in OPEN_PATHS or path.startswith("/static/")):
            given = request.headers.get("authorization", "")
            if not given and _EVENTS.fullmatch(path) and "key" in request.query_params:
                given = f"Bearer {request.query_params['key']}"     # EventSource: no headers
            if not hmac.compare_digest(given.encode(), f"Bearer {state.api_key}".encode()):
                return error(401, "this server needs 'Authorization: Bearer KEY' (the key "
                             "given to ditax serve --api-key)", headers={"WWW-Authenticate":
                                                                         "Bearer"})
        return await call_next(request)

    def find(job_id: str):
        job = state.store.get(job_id) if _ID.fullmatch(job_id) else None
        if job is None:
            return None, error(404, f"no video {job_id!r} on this server (GET /v1/videos "
                                    f"lists them)", "id")
        return job, None

    @app.post("/v1/videos")
    async def submit(request: Request):
        raw = await request.body()
        if len(raw) > state.limits.body_bytes:
            return error(413, f"the body has {len(raw)} bytes, more than this server's "
                              f"{state.limits.body_bytes}; send smaller images")
        try:
            body = json.loads(raw or b"null")
        except ValueError as e:
            return error(400, f"the body is not JSON ({e}); send e.g. {{\"prompt\": \"a cat\"}}")
        try:
            checked = await run_in_threadpool(
                check_body, body, state.model, state.overrides,
                str(state.output_dir / "request.mp4"), state.limits,
                tuple(name for name, _ in state.loras), (), state.makes)
            job = state.store.add(checked.stored, checked.batch_key, state.max_queue,
                                  kind=state.makes)
        except BadRequest as e:
            return error(e.status, str(e), e.param)
        except QueueFull as e:
            wait = retry_after(state, int(e.args[0]))
            return error(429, f"the queue is full ({e.args[0]} jobs, --max-queue "
                              f"{state.max_queue}); retry in {wait} s", headers={
                                  "Retry-After": str(wait)})
        state.worker.wake.set()
        return job_json(job)

    @app.get("/v1/videos")
    def list_videos(limit: str = "20", after: str | None = None):
        if not re.fullmatch(r"[0-9]{1,4}", limit) or not 1 <= int(limit) <= 100:
            return error(400, f"limit={limit} must be an integer in 1..100, e.g. limit=20",
                         "limit")
        limit = int(limit)
        jobs, more = state.store.list(limit, after)
        data = [job_json(j) for j in jobs]
        return {"object": "list", "data": data, "has_more": more,
                "last_id": data[-1]["id"] if data else None}

    @app.get("/v1/videos/{job_id}")
    def get_video(job_id: str):
        job, err = find(job_id)
        return err or job_json(job)

    @app.get("/v1/videos/{job_id}/events")
    async def events(job_id: str, request: Request):
        job, err = await run_in_threadpool(find, job_id)
        if err:
            return err
        return StreamingResponse(event_stream(state, job_id, request), headers={
            "Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            media_type="text/event-stream")

    @app.get("/v1/videos/{job_id}/chunks/{index}")
    def chunk(job_id: str, index: str):
        job, err = find(job_id)
        got = err or chunk_frames(getattr(state.worker, "chunks", None), job, index)
        if isinstance(got, tuple):
            return error(*got)
        return got if err else Response(got, media_type="image/jpeg",
                                        headers={"Cache-Control": "no-cache"})

    @app.get("/v1/videos/{job_id}/content")
    def content(job_id: str, variant: str | None = None):
        job, err = find(job_id)
        if err:
            return err
        main = "image" if state.makes == "image" else "video"
        if variant not in (None, main, *state.outputs):
            return error(400, f"variant={variant!r}: this server's jobs have "
                              f"{', '.join((main, *state.outputs))}", "variant")
        if job["status"] != "completed":
            return error(404, f"video {job_id} is {job['status']}"
                         + (f" ({job['progress']}%)" if job["status"] == "in_progress" else "")
                         + "; its content is there once status is completed", "id")
        path = state.output_dir / (job["file"] or "")
        if not job["file"] or not path.is_file():
            return error(404, f"video {job_id}'s file was deleted", "id")
        if variant not in (None, main):      # a further output, written beside the main one
            path = extra_path(path, variant)
            if not path.is_file():
                return error(404, f"video {job_id} has no {variant} file", "variant")
            return FileResponse(path, media_type="application/octet-stream",
                                filename=f"{job_id}.{variant}.npy")
        kind = "image/png" if path.suffix == ".png" else "video/mp4"
        return FileResponse(path, media_type=kind, filename=f"{job_id}{path.suffix}")

    @app.delete("/v1/videos/{job_id}")
    def delete(job_id: str):
        job, err = find(job_id)
        if err:
            return err
        if job["status"] in FINISHED:
            if job["file"]:
                for path in [state.output_dir / job["file"], *(
                        extra_path(state.output_dir / job["file"], k) for k in state.outputs)]:
                    path.unlink(missing_ok=True)
                state.store.forget_file(job_id)
            return {"id": job_id, "object": "video.deleted", "deleted": True}
        state.worker.cancel(job_id)
        state.store.finish(job_id, "cancelled")
        return job_json(state.store.get(job_id))

    @app.get("/v1/loras")
    def list_loras():
        return {"object": "list", "data": [{"id": name, "object": "lora", "name": name,
                                            "file": pathlib.Path(f).name}
                                           for name, f in state.loras]}

    @app.get("/health")
    def health():
        counts, queued = state.store.counts(), state.store.queued()
        alive = ((state.worker.is_alive() or not state.worker.started)
                 and not state.health.get("process_lost"))
        ready = state.ready
        body = {"status": "ok" if alive and ready else "warming" if alive else
                "worker stopped", **state.health, "ready": ready and alive,
                # the jobs this server can run; the rest wait for another model (or files)
                "queue_depth": queued["mine"], "queued_for_others": queued["others"],
                "in_progress": counts["in_progress"],
                "max_queue": state.max_queue, "max_batch": state.max_batch}
        if state.warm:
            specs = [spec for spec, _ in state.warm]
            body.update({"warmed": specs, "warm_seconds": state.warm_seconds,
                         "warm_programs": state.warm_programs,
                         "warm_cache_hits": state.warm_cache_hits} if ready else
                        {"warming": specs})
            if state.warm_error:
                body["warm_error"] = state.warm_error
        return body if alive and ready else JSONResponse(body, status_code=503)

    @app.get("/metrics")
    def metrics():
        return PlainTextResponse(metrics_text(state), media_type="text/plain; version=0.0.4")

    @app.get("/")
    def page():
        return FileResponse(STATIC / "index.html", media_type="text/html")

    @app.exception_handler(RequestValidationError)
    async def invalid(request, exc):      # a query or path parameter FastAPI refused
        first = (exc.errors() or [{}])[0]
        where = [str(p) for p in first.get("loc", ()) if p not in ("query", "path", "body")]
        param = where[-1] if where else None
        said = f"{param}={first.get('input')}" if param else "the request"
        return error(400, f"{said}: {first.get('msg', 'invalid').lower()}", param)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc):   # no such route (404), or method (405)
        what = {404: f"no route {request.url.path}; the API is POST /v1/videos, GET "
                     f"/v1/videos[/ID[/content|/events|/chunks/N]], DELETE /v1/videos/ID, GET "
                     f"/v1/loras, GET /health, GET /metrics",
                405: f"{request.method} is not a method of {request.url.path}"}
        return error(exc.status_code, what.get(exc.status_code, str(exc.detail)),
                     headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def failure(request, exc):
        return error(500, f"{type(exc).__name__}: {exc}")

    return app


def retry_after(state: ServeState, waiting: int) -> int:
    """Seconds until a slot is likely free: the mean job time over the batch size, >= 1."""
    m = state.metrics
    mean = m.job_seconds / m.jobs if m.jobs else 10.0
    return max(1, math.ceil(mean / max(1, state.max_batch)))


async def event_stream(state: ServeState, job_id: str, request: Request):
    """The Server-Sent Events of job ``job_id``: its JSON now and at each change of its status
    or progress (the store read every :data:`EVENT_POLL` seconds), ending after a finished
    status; a causal model's job also one event per finished chunk, in order, with ``chunk``
    (``index``, ``frames`` made so far; :mod:`ditax.serve.chunks`). Its progress never goes
    back (a row read before a chunk logged since is older than the chunk: not sent) but when
    the job is back in the queue. A server that is stopping ends the streams of the jobs it
    does not run (a client's ``EventSource`` reconnects, to the next server on the store)."""
    last, quiet, seen, top = None, 0.0, 0, 0
    log = getattr(state.worker, "chunks", None)     # a causal model's chunks (serve.chunks)
    while True:
        job = await run_in_threadpool(state.store.get, job_id)
        if job is None:                   # gone from a shared store: nothing more to say
            return
        view = job_json(job)
        chunks = [] if log is None else log.since(job_id, seen)
        for c in chunks:                  # each, before the end
            top = max(top, c.pop("progress"))
            seen, last, quiet = seen + 1, ("in_progress", top), 0.0
            chunk = {**view, "status": "in_progress", "progress": top, "chunk": c}
            yield f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n"
        # progress never goes back: the row was read before the chunks, so it may be older
        # than they are (a queued row their run's claim followed); only a requeue resets it
        if view["status"] == "queued" and not chunks:
            top = 0
        else:
            top = view["progress"] = max(top, view["progress"])
            view["status"] = "in_progress" if view["status"] == "queued" else view["status"]
        if (view["status"], view["progress"]) != last:
            last, quiet = (view["status"], view["progress"]), 0.0
            yield f"data: {json.dumps(view, separators=(',', ':'))}\n\n"
        elif quiet >= KEEP_ALIVE:
            quiet = 0.0
            yield ": keep-alive\n\n"
        if view["status"] in FINISHED or await request.is_disconnected() or (
                state.worker.stopping and job_id not in state.worker.running):
            return
        await asyncio.sleep(EVENT_POLL)
        quiet += EVENT_POLL


__all__ = ["ServeState", "create_app", "job_json", "metrics_text"]
