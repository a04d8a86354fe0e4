"""A job store used over time by servers of different models (issue 57 item 6), and the API's
one error format for every 4xx, query parameters and unknown routes included (item 7). The app
is called in this process (:mod:`asgi_calls`): no model loads, no server starts."""

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
