"""``GET /v1/videos/{id}/events`` of a real ``ditax serve`` (the demo model, an API key): a
``text/event-stream`` whose events are the job's JSON at each change of its status or progress
— read with ``http.client`` while the job runs: progress never goes back, passes an
intermediate value, and the last event is ``completed`` at 100, after which the stream ends; a
cancelled job's stream ends with ``cancelled``. The route takes the key as a header or, for a
browser's ``EventSource``, as ``?key=`` (no other route does); an unknown id is a 404 JSON."""

from __future__ import annotations

import http.client
import json

import pytest
from serve_fixtures import LONG, Server, shared_cache

KEY = "events-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # --max-batch 1: the browser module's programs for LONG (one compile cache)
    srv = Server(tmp_path_factory.mktemp("serve_events"), "--max-batch", "1", "--api-key",
                 KEY, cache=shared_cache(tmp_path_factory)).start()
    yield srv
    assert srv.stop() == 0, srv.log.read_text()[-2000:]


def open_events(srv, job_id: str, headers=None, query: str = ""):
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
    conn.request("GET", f"/v1/videos/{job_id}/events{query}", headers=headers or {})
    return conn, conn.getresponse()


def read_events(response, on_event=None) -> list[dict]:
    """The ``data:`` of each event until the server ends the stream (``on_event(job)`` after
    each); every line must be an event field, a comment or the blank line ending an event."""
    events, data = [], []
    while True:
        line = response.readline()
        if not line:
            assert not data, f"the stream ended inside an event: {data}"
            return events
        line = line.decode().rstrip("\n")
        if line == "":
            if data:
                events.append(json.loads("\n".join(data)))
                data = []
                if on_event:
                    on_event(events[-1])
        elif line.startswith("data: "):
            data.append(line[len("data: "):])
        else:
            assert line.startswith(":"), f"not an event-stream line: {line!r}"


def test_events_follow_a_job_to_completed(server):
    job = server.submit(headers=AUTH, seed=11, **LONG)
    conn, r = open_events(server, job["id"], AUTH)
    try:
        assert r.status == 200 and r.getheader("content-type").startswith("text/event-stream")
        events = read_events(r)
    finally:
        conn.close()
    assert all(e["id"] == job["id"] for e in events)
    progress = [e["progress"] for e in events]
    assert progress == sorted(progress), progress                 # never goes back
    assert any(0 < p < 100 for p in progress), progress           # the steps, as they run
    assert events[-1]["status"] == "completed" and progress[-1] == 100, events[-1]
    assert all(e["status"] in ("queued", "in_progress") for e in events[:-1]), events
    changes = [(e["status"], e["progress"]) for e in events]
    assert len(set(changes)) == len(changes), changes             # an event per change only
    assert events[-1]["url"] == f"/v1/videos/{job['id']}/content"
    # a finished job's stream: its one final event, then the end
    conn, r = open_events(server, job["id"], AUTH)
    try:
        again = read_events(r)
    finally:
        conn.close()
    assert [(e["status"], e["progress"]) for e in again] == [("completed", 100)]


def test_events_end_with_cancelled(server):
    job = server.submit(headers=AUTH, seed=12, **{**LONG, "num_inference_steps": 200})
    conn, r = open_events(server, job["id"], AUTH)

    def cancel_once_running(event):
        if event["status"] == "in_progress" and event["progress"] > 0 and not cancelled:
            cancelled.append(server.call("DELETE", f"/v1/videos/{job['id']}", headers=AUTH))

    cancelled = []
    try:
        events = read_events(r, cancel_once_running)
    finally:
        conn.close()
    assert cancelled and cancelled[0][0] == 200, cancelled
    assert events[-1]["status"] == "cancelled" and events[-1]["progress"] < 100, events[-1]


def test_events_key_and_unknown_id(server):
    job = server.submit(headers=AUTH, seed=13, **LONG)
    server.wait(job["id"], headers=AUTH)
    path = f"/v1/videos/{job['id']}"
    # no key, a wrong one: 401 JSON, as every other API route
    for query in ("", "?key=wrong"):
        status, _, body = server.call("GET", f"{path}/events{query}")
        assert status == 401 and "Authorization: Bearer KEY" in body["error"]["message"], body
    # ?key= is taken by the events route only (EventSource sends no header)
    conn, r = open_events(server, job["id"], query=f"?key={KEY}")
    try:
        assert r.status == 200
        assert [e["status"] for e in read_events(r)] == ["completed"]
    finally:
        conn.close()
    assert server.call("GET", f"{path}?key={KEY}")[0] == 401
    assert server.call("GET", f"/v1/videos?key={KEY}")[0] == 401
    # an unknown or malformed id: 404 JSON naming it, no stream
    for bad in ("video_" + "0" * 32, "nope"):
        status, head, body = server.call("GET", f"/v1/videos/{bad}/events", headers=AUTH)
        assert status == 404 and head["content-type"] == "application/json", (status, head)
        assert bad in body["error"]["message"] and body["error"]["param"] == "id", body
