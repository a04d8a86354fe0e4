"""``ditax serve``'s continuous batching (the default ``--batching continuous``) against a real
server with the demo model: a job submitted while another of its shape runs joins the running
batch at the next step (both report ``batch_size`` 2) and its video equals the same request
run alone; with ``--max-wait 0`` a queued job of another shape stops the running batch from
taking new rows, so it runs before a later job of the running shape."""

from __future__ import annotations

import pytest
from serve_fixtures import LONG, SMALL, Server, assert_same_video, mp4_frames, shared_cache


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("serve_continuous"), "--max-batch", "4",
                 "--max-wait", "0", cache=shared_cache(tmp_path_factory)).start()
    yield srv
    assert srv.stop() == 0, srv.log.read_text()[-2000:]


def _running(srv, job_id: str, at_least: int) -> dict:
    """Wait until ``job_id`` runs with progress >= ``at_least`` (a few steps done)."""
    job = srv.wait(job_id, ("in_progress",), poll=0.01)
    while job["status"] == "in_progress" and job["progress"] < at_least:
        job = srv.call("GET", f"/v1/videos/{job_id}")[2]
    assert job["status"] == "in_progress", f"the job ended before the next joined: {job}"
    return job


def test_a_job_joins_the_running_batch_and_equals_alone(server, tmp_path):
    first = server.submit(seed=11, **LONG)
    at = _running(server, first["id"], 10)["progress"]
    joined = server.submit(seed=12, **LONG)
    a, b = server.wait(first["id"]), server.wait(joined["id"])
    assert a["status"] == b["status"] == "completed", (a, b)
    assert a["batch_size"] == b["batch_size"] == 2, (a, b)
    assert 0 < at < 100
    alone = server.wait(server.submit(seed=12, **LONG)["id"])
    assert alone["batch_size"] == 1 and alone["compiles"] == 0, alone
    got = mp4_frames(server.call("GET", b["url"])[2], tmp_path)
    want = mp4_frames(server.call("GET", alone["url"])[2], tmp_path)
    assert_same_video(got, want)
    other = mp4_frames(server.call("GET", a["url"])[2], tmp_path)
    assert abs(other.astype(int) - want.astype(int)).mean() > 0.5    # its own seed reached it


def test_another_shapes_job_stops_the_batch_taking_rows(server):
    running = server.submit(seed=21, **LONG)
    _running(server, running["id"], 10)
    other = server.submit(seed=22, **SMALL)                # 2 steps: another batch key
    later = server.submit(seed=23, **LONG)                 # the running key, after it
    r, o, d = (server.wait(j["id"]) for j in (running, other, later))
    assert [j["status"] for j in (r, o, d)] == ["completed"] * 3, (r, o, d)
    assert r["batch_size"] == 1 and d["batch_size"] == 1, (r, d)   # `later` did not join
    assert r["completed_at"] <= o["completed_at"] <= d["completed_at"], (r, o, d)
