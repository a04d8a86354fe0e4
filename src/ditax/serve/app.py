"""The HTTP API of ``ditax serve`` (FastAPI): OpenAI-style ``/v1/videos`` jobs, health, metrics,
the web page.

Routes (JSON unless said; errors are ``{"error": {"message", "param", "type"}}``):

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
- ``GET /v1/videos?limit=&after=`` — newest first (``after``: the last id of the previous page);
- ``DELETE /v1/videos/{id}`` — cancels a queued or running job; a finished one's file is
  deleted (the record stays);
- ``GET /v1/loras`` — the LoRAs of ``--lora-dir`` (a request names them in ``loras`` with a
  strength; unmerged, so switching compiles nothing);
- ``GET /health`` (model, platform, devices, queue depth; never needs the key), ``GET /metrics``
  (Prometheus text), ``GET /`` the page (``static/``; page and scripts need no key, the API
  calls they make do).

With an API key every other route needs ``Authorization: Bearer KEY`` (401 otherwise).
"""

from __future__ import annotations

import hmac
import json
import math
import pathlib
import re
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool

from ditax.serve.jobs import FINISHED, JobStore, QueueFull
from ditax.io.outputs import extra_path
from ditax.serve.requests import BadRequest, Limits, check_body
from ditax.serve.worker import Metrics, Worker

STATIC = pathlib.Path(__file__).parent / "static"
_ID = re.compile(r"video_[0-9a-f]{32}")
OPEN_PATHS = ("/health", "/", "/static/")


@dataclass
class ServeState:
    """What the routes share: the served model (path and overrides), the store, the worker,
    limits and settings."""

    model: str
    overrides: list
    parse_request: object          # ditax generate's (args -> (load, call)), see .requests
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

    @property
    def metrics(self) -> Metrics:
        return self.worker.metrics


def error(status: int, message: str, param: str | None = None, headers=None):
    kind = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found",
            413: "request_too_large", 429: "queue_full"}.get(status, "server_error")
    return JSONResponse({"error": {"message": message, "param": param, "type": kind}},
                        status_code=status, headers=headers)


def job_json(job: dict, makes: str = "video") -> dict:
    """The API view of a job row (``makes``: the served family's output kind, the object)."""
    req = {k: v for k, v in job["request"].items() if k not in ("image", "last_image")}
    kind = "image" if makes == "image" else "video"
    out = {"id": job["id"], "object": kind, "status": job["status"],
           "progress": job["progress"], "created_at": int(job["created_at"]),
           "completed_at": None if job["finished_at"] is None else int(job["finished_at"]),
           "error": None if not job["error"] else {"message": job["error"]},
           "size": f"{req['width']}x{req['height']}", **req,
           "has_image": "image" in job["request"], "attempts": job["attempts"],
           "batch_size": job["batch_size"], "compiles": job["compiles"],
           "seconds_to_finish": None if job["seconds"] is None else round(job["seconds"], 3),
           "warnings": json.loads(job["warnings"]) if job.get("warnings") else []}
    if job["status"] == "completed" and job["file"]:
        out["url"] = f"/v1/videos/{job['id']}/content"
    return out


def create_app(state: ServeState):
    """The FastAPI application over ``state``: the worker starts with it and begins to stop
    with it (:meth:`~ditax.serve.worker.Worker.begin_stop`; whoever runs the app joins it)."""
    import contextlib

    @contextlib.asynccontextmanager
    async def lifespan(app):
        state.worker.start()
        yield
        state.worker.begin_stop()     # the process joins it (ditax.cli.serve)

    app = FastAPI(title="ditax serve", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.middleware("http")
    async def auth(request: Request, call_next):
        path = request.url.path
        if state.api_key and not (path in OPEN_PATHS or path.startswith("/static/")):
            given = request.headers.get("authorization", "")
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
                str(state.output_dir / "request.mp4"), state.parse_request, state.limits,
                tuple(name for name, _ in state.loras), (), state.makes)
            job = state.store.add(checked.stored, checked.batch_key, state.max_queue)
        except BadRequest as e:
            return error(e.status, str(e), e.param)
        except QueueFull as e:
            wait = retry_after(state, int(e.args[0]))
            return error(429, f"the queue is full ({e.args[0]} jobs, --max-queue "
                              f"{state.max_queue}); retry in {wait} s", headers={
                                  "Retry-After": str(wait)})
        state.worker.wake.set()
        return job_json(job, state.makes)

    @app.get("/v1/videos")
    def list_videos(limit: int = 20, after: str | None = None):
        if not 1 <= limit <= 100:
            return error(400, f"limit={limit} must be in 1..100", "limit")
        jobs, more = state.store.list(limit, after)
        data = [job_json(j, state.makes) for j in jobs]
        return {"object": "list", "data": data, "has_more": more,
                "last_id": data[-1]["id"] if data else None}

    @app.get("/v1/videos/{job_id}")
    def get_video(job_id: str):
        job, err = find(job_id)
        return err or job_json(job, state.makes)

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
        return job_json(state.store.get(job_id), state.makes)

    @app.get("/v1/loras")
    def list_loras():
        return {"object": "list", "data": [{"id": name, "object": "lora", "name": name,
                                            "file": pathlib.Path(f).name}
                                           for name, f in state.loras]}

    @app.get("/health")
    def health():
        counts = state.store.counts()
        alive = state.worker.is_alive() or not state.worker.started
        body = {"status": "ok" if alive else "worker stopped", **state.health,
                "queue_depth": counts["queued"], "in_progress": counts["in_progress"],
                "max_queue": state.max_queue, "max_batch": state.max_batch}
        return body if alive else JSONResponse(body, status_code=503)

    @app.get("/metrics")
    def metrics():
        return PlainTextResponse(metrics_text(state), media_type="text/plain; version=0.0.4")

    @app.get("/")
    def page():
        return FileResponse(STATIC / "index.html", media_type="text/html")

    @app.exception_handler(Exception)
    async def failure(request, exc):
        return JSONResponse({"error": {"message": f"{type(exc).__name__}: {exc}",
                                       "type": "server_error"}}, status_code=500)

    return app


def retry_after(state: ServeState, waiting: int) -> int:
    """Seconds until a slot is likely free: the mean job time over the batch size, >= 1."""
    m = state.metrics
    mean = m.job_seconds / m.jobs if m.jobs else 10.0
    return max(1, math.ceil(mean / max(1, state.max_batch)))


def metrics_text(state: ServeState) -> str:
    """Prometheus text exposition of the store's counts and the worker's counters."""
    m, counts = state.metrics, state.store.counts()
    lines = ["# HELP ditax_jobs Jobs in the store by status.", "# TYPE ditax_jobs gauge"]
    lines += [f'ditax_jobs{{status="{s}"}} {n}' for s, n in counts.items()]
    rows = (("queue_depth", "gauge", "Jobs waiting to run.", counts["queued"]),
            ("compiles_total", "counter", "Programs handed to XLA since the server started: "
             "compiled, or read from the persistent compile cache (a warm program in memory "
             "counts nothing).", m.compiles),
            ("compile_cache_hits_total", "counter", "Of those, the ones read from the "
             "persistent compile cache.", m.cache_hits),
            ("compile_seconds_total", "counter", "Seconds spent in XLA compilation.",
             round(m.compile_seconds, 6)),
            ("steps_total", "counter", "Denoising steps run (a batch's step counts once).",
             m.steps),
            ("step_seconds_total", "counter", "Seconds of denoising steps.",
             round(m.step_seconds, 6)),
            ("jobs_completed_total", "counter", "Jobs completed since the server started.",
             m.jobs),
            ("job_seconds_total", "counter", "Seconds from submit to completed, summed.",
             round(m.job_seconds, 6)),
            ("batches_total", "counter", "Batches run.", m.batches),
            ("batched_jobs_total", "counter", "Jobs run in those batches.", m.batched_jobs))
    for name, kind, text, value in rows:
        lines += [f"# HELP ditax_{name} {text}", f"# TYPE ditax_{name} {kind}",
                  f"ditax_{name} {value}"]
    return "\n".join(lines) + "\n"


__all__ = ["ServeState", "create_app", "job_json", "metrics_text"]
