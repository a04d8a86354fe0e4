"""A job store used over time by servers of different models (issue 57 item 6), and the API's
one error format for every 4xx, query parameters and unknown routes included (item 7); a job's
progress never goes back, in either store or in its event stream. The app is called in this
process (:mod:`asgi_calls`, or its event stream alone): no model loads, no server starts."""

from __future__ import annotations

import pytest
from asgi_calls import app_state, call
from pg_fixtures import postgres  # noqa: F401 — the session's PostgreSQL server (or a skip)

from ditax.serve.app import create_app
from ditax.serve.jobs import JobStore
from ditax.serve.stores import open_store

WAN = {"prompt": "a cat", "height": 32, "width": 32, "num_frames": 5, "seed": 0}
FLUX = {"prompt": "a cat", "height": 64, "width": 64, "seed": 0}


@pytest.fixture
def shared(tmp_path):
    """A store that a Wan server filled first (two jobs), then a FLUX server (one job)."""
    db = tmp_path / "jobs.sqlite"
    wan = JobStore(db, model="/models/wan", model_hash="w1")
    wan.add(WAN, None, 64, kind="video")
    wan.add(WAN, None, 64, kind="video")
    wan.close()
    flux = JobStore(db, model="/models/flux", model_hash="f1")
    flux.add(FLUX, None, 64, kind="image")
    yield flux
    flux.close()


def test_each_job_keeps_its_model_and_kind(shared):
    jobs, _ = shared.list(10)
    assert [(j["model"], j["kind"]) for j in jobs] == [
        ("/models/flux", "image"), ("/models/wan", "video"), ("/models/wan", "video")]
    app = create_app(app_state(shared, "/models/flux", makes="image"))
    status, page = call(app, "GET", "/v1/videos")
    assert status == 200
    assert [(d["object"], d["model"]) for d in page["data"]] == [
        ("image", "/models/flux"), ("video", "/models/wan"), ("video", "/models/wan")]
    assert "num_frames" in page["data"][1] and "num_frames" not in page["data"][0]


def test_a_job_of_an_older_store_is_shown_as_what_it_asked_for(tmp_path):
    """A row written before jobs kept their kind (kind NULL): a request with frames is a
    video, one without is an image, whatever the server now serves."""
    store = JobStore(tmp_path / "jobs.sqlite", model="/models/flux", model_hash="f1")
    store.add(WAN, None, 64)
    store.add(FLUX, None, 64)
    app = create_app(app_state(store, "/models/flux", makes="image"))
    _, page = call(app, "GET", "/v1/videos")
    assert [d["object"] for d in page["data"]] == ["image", "video"]
    store.close()


def test_health_counts_only_the_jobs_this_server_can_run(shared):
    assert shared.queued() == {"mine": 1, "others": 2}
    app = create_app(app_state(shared, "/models/flux", makes="image"))
    _, health = call(app, "GET", "/health")
    assert health["queue_depth"] == 1 and health["queued_for_others"] == 2


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_both_stores_keep_kind_and_split_the_queue(kind, tmp_path, request):
    """The SQLite and PostgreSQL stores answer alike: each job's model and kind, and the
    queue split into this server's jobs and the others'."""
    db = (request.getfixturevalue("postgres").database() if kind == "postgresql"
          else tmp_path / "jobs.sqlite")
    wan = open_store(db, model="/models/wan", model_hash="w1")
    flux = open_store(db, model="/models/flux", model_hash="f1")
    try:
        wan.add(WAN, None, 64, kind="video")
        flux.add(FLUX, None, 64, kind="image")
        flux.add(FLUX, None, 64, kind="image")
        jobs, _ = flux.list(10)
        assert [(j["model"], j["kind"]) for j in jobs] == [
            ("/models/flux", "image"), ("/models/flux", "image"), ("/models/wan", "video")]
        assert flux.queued() == {"mine": 2, "others": 1}
        assert wan.queued() == {"mine": 1, "others": 2}
    finally:
        wan.close()
        flux.close()


def test_health_counts_jobs_of_the_same_model_with_other_files_as_others(tmp_path):
    db = tmp_path / "jobs.sqlite"
    old = JobStore(db, model="/models/wan", model_hash="old")
    old.add(WAN, None, 64, kind="video")
    old.close()
    new = JobStore(db, model="/models/wan", model_hash="new")
    new.add(WAN, None, 64, kind="video")
    assert new.queued() == {"mine": 1, "others": 1}
    new.close()


@pytest.mark.parametrize("target, param", [
    ("/v1/videos?limit=abc", "limit"),
    ("/v1/videos?limit=1.5", "limit"),
    ("/v1/videos?limit=0", "limit"),
])
def test_a_bad_query_parameter_gets_the_api_error(shared, target, param):
    app = create_app(app_state(shared, "/models/flux", makes="image"))
    status, body = call(app, "GET", target)
    assert status == 400, body
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"message", "type", "param"}
    assert err["type"] == "invalid_request_error" and err["param"] == param
    assert "limit=" in err["message"] and "1..100" in err["message"]


@pytest.mark.parametrize("method, target, status", [
    ("GET", "/v1/nothing", 404), ("PUT", "/v1/videos", 405)])
def test_an_unknown_route_or_method_gets_the_api_error(shared, method, target, status):
    app = create_app(app_state(shared, "/models/flux", makes="image"))
    got, body = call(app, method, target)
    assert got == status, body
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param"}
    assert target.split("?")[0] in body["error"]["message"]


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_both_stores_never_lower_a_running_jobs_progress(kind, tmp_path, request):
    """A late, lower progress (99 then 72) leaves a running job's at 99, alone or in a batch's
    update; only a new run (requeue, claim) starts it at 0 again."""
    db = (request.getfixturevalue("postgres").database() if kind == "postgresql"
          else tmp_path / "jobs.sqlite")
    store = open_store(db, model="/models/wan", model_hash="w1")
    try:
        job = store.add(WAN, None, 64, kind="video")["id"]
        assert [j["id"] for j in store.claim(1)] == [job]
        store.set_progress(job, 99)
        store.set_progress(job, 72)
        assert store.get(job)["progress"] == 99
        store.set_progress_many({job: 50})
        assert store.get(job)["progress"] == 99
        assert store.requeue(job) and store.get(job)["progress"] == 0
        assert [j["progress"] for j in store.claim(1)] == [0]
        store.set_progress_many({job: 30})
        store.set_progress(job, 10)
        assert store.get(job)["progress"] == 30
    finally:
        store.close()


def follow(store, log, job_id: str, moves: list) -> list[tuple[str, int, bool]]:
    """``(status, progress, is a chunk event)`` of each event of ``job_id``'s stream
    (:func:`ditax.serve.app.event_stream`, called here), where the worker makes its next move
    (``moves``, in order) each time the stream has read the job's row, before it reads the
    chunk ``log``: the order that a loaded host's thread switches can give."""
    import asyncio
    import json
    import types

    from ditax.serve import app as app_module

    read = store.get

    def get(job_id):
        row = read(job_id)
        if moves:
            moves.pop(0)()
        return row

    worker = types.SimpleNamespace(chunks=log, stopping=False, running={})
    state = types.SimpleNamespace(store=types.SimpleNamespace(get=get), worker=worker)

    class Connected:
        async def is_disconnected(self):
            return False

    async def events():
        return [json.loads(e[len("data: "):]) async for e in
                app_module.event_stream(state, job_id, Connected()) if e.startswith("data: ")]

    return [(e["status"], e["progress"], "chunk" in e) for e in asyncio.run(events())]


def test_a_row_read_before_a_chunk_never_sends_progress_back(tmp_path, monkeypatch):
    """A causal job's stream read the row (chunk 2's progress, 72), the worker logged chunk 3
    (99), then the stream read the chunk log: chunk 3's event (99), then the older row's (72)
    — the progress went back (the flaky 99-then-72 of test_serve_causal_events). The row read
    before the chunks is no news; a requeued job's stream starts at 0 again."""
    from ditax.serve import app as app_module
    from ditax.serve.chunks import ChunkLog

    monkeypatch.setattr(app_module, "EVENT_POLL", 0.0)
    store, log = JobStore(tmp_path / "jobs.sqlite"), ChunkLog()
    job = store.add(WAN, None, 64, kind="video")["id"]
    store.claim(1)

    def chunk(index: int, frames: int, progress: int) -> None:   # the worker's on_chunk
        log.add(job, index, frames, progress)
        store.set_progress(job, progress)

    for i, (frames, progress) in enumerate([(5, 17), (13, 44), (21, 72)]):
        chunk(i, frames, progress)
    moves = [lambda: chunk(3, 29, 99), lambda: store.finish(job, "completed", file="x.mp4")]
    assert follow(store, log, job, moves) == [
        ("in_progress", 17, True), ("in_progress", 44, True), ("in_progress", 72, True),
        ("in_progress", 99, True), ("completed", 100, False)]
    # a job without chunks: back in the queue (progress 0), then its next run's progress
    other = store.add(WAN, None, 64, kind="video")["id"]
    store.claim(1)
    store.set_progress(other, 50)
    moves = [lambda: store.requeue(other), lambda: store.claim(1),
             lambda: store.set_progress(other, 10),
             lambda: store.finish(other, "completed", file="y.mp4")]
    assert follow(store, log, other, moves) == [
        ("in_progress", 50, False), ("queued", 0, False), ("in_progress", 0, False),
        ("in_progress", 10, False), ("completed", 100, False)]
    store.close()
