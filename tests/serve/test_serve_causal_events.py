"""``GET /v1/videos/{id}/events`` on a causal folder (issue 59 item 3): the served demo model
marked causal runs its job chunk by chunk in the worker thread, and the stream sends one event
per finished chunk (``chunk: {index, frames}``, in order, frames made so far) while the job is
still running, then the completion event; the mp4 holds every frame. The app is called in this
process through ASGI (no socket), with a real worker over a SQLite store."""

from __future__ import annotations

import asyncio
import json
import pathlib

import pytest
from asgi_calls import call, call_raw
from causal_folders import causal_demo_folder

import ditax
from ditax.serve.app import ServeState, create_app
from ditax.serve.jobs import JobStore
from ditax.serve.worker import Worker


def follow_events(app, job_id: str, store) -> list[tuple[dict, str]]:
    """Each event of the job's stream with the job's status in the store when it arrived."""
    target = f"/v1/videos/{job_id}/events"
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "GET", "scheme": "http", "path": target, "raw_path": target.encode(),
             "query_string": b"", "root_path": "", "headers": [(b"host", b"test")],
             "client": ("127.0.0.1", 1), "server": ("test", 80)}
    out, buf, sent = [], [""], [False]

    async def receive():
        if not sent[0]:
            sent[0] = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()        # a client that stays connected

    async def send(message):
        if message["type"] != "http.response.body":
            return
        buf[0] += message.get("body", b"").decode()
        while "\n\n" in buf[0]:
            event, buf[0] = buf[0].split("\n\n", 1)
            data = [ln[len("data: "):] for ln in event.splitlines() if ln.startswith("data: ")]
            if data:
                out.append((json.loads("\n".join(data)), store.get(job_id)["status"]))

    asyncio.run(app(scope, receive, send))
    return out


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("causal_serve")
    folder = causal_demo_folder(root)
    store = JobStore(root / "jobs.db")
    worker = Worker(ditax.load_pipeline(folder), store, root / "out", say=lambda *a: None)
    (root / "out").mkdir()
    state = ServeState(model=str(folder), overrides=[], store=store, worker=worker,
                       output_dir=root / "out")
    worker.start()
    yield create_app(state), store, root / "out"
    worker.begin_stop()
    worker.join(60)


@pytest.fixture(scope="module")
def streamed(served):
    """One 29-frame job (4 chunks) run to completion: ``(job, events)``."""
    app, store, _ = served
    status, job = call(app, "POST", "/v1/videos",
                       json.dumps({"prompt": "a red ball", "num_frames": 29, "seed": 3}).encode())
    assert status == 200, job
    return job, follow_events(app, job["id"], store)


def test_chunk_events_arrive_in_order_before_completion(served, streamed):
    app, store, out = served
    job, events = streamed
    chunks = [(e["chunk"], at) for e, at in events if "chunk" in e]
    assert [c["index"] for c, _ in chunks] == [0, 1, 2, 3], events
    assert [c["frames"] for c, _ in chunks] == [5, 13, 21, 29]     # made so far
    assert chunks[0][1] == "in_progress"           # sent while the job was still running
    last = events[-1][0]
    assert last["status"] == "completed" and last["progress"] == 100 and "chunk" not in last
    kinds = ["chunk" in e for e, _ in events]
    assert kinds.index(True) < len(kinds) - 1 and not kinds[-1]    # chunks, then the end
    progress = [e["progress"] for e, _ in events]
    assert progress == sorted(progress), progress
    from ditax.io.video import read_video

    assert read_video(pathlib.Path(out) / store.get(job["id"])["file"]).shape[0] == 29


def test_chunk_frames_are_the_videos(served, streamed):
    """Each chunk event names its frames (``url``: one JPEG of ``count`` frames stacked top to
    bottom, what the page plays while the rest is made); together they are the mp4's frames
    (both lossy: JPEG at quality 90, H.264: a mean difference of a few levels, against tens
    for another chunk's frames). A chunk number that is no integer: 400 in one line; a chunk
    not made: 404."""
    import io

    import numpy as np
    import PIL.Image

    from ditax.io.video import read_video

    app, store, out = served
    job, events = streamed
    chunks = [e["chunk"] for e, _ in events if "chunk" in e]
    assert [(c["first"], c["count"]) for c in chunks] == [(0, 5), (5, 8), (13, 8), (21, 8)]
    strips = []
    for c in chunks:
        status, head, body = call_raw(app, "GET", c["url"])
        assert status == 200 and head["content-type"] == "image/jpeg", body[:200]
        strips.append(np.asarray(PIL.Image.open(io.BytesIO(body)).convert("RGB")))
        assert strips[-1].shape == (c["count"] * 64, 64, 3)
    got = np.concatenate(strips).reshape(29, 64, 64, 3).astype(np.float32)
    video = read_video(pathlib.Path(out) / store.get(job["id"])["file"]).astype(np.float32)
    near = np.abs(got - video).mean()
    other = np.abs(got[5:13] - video[13:21]).mean()      # chunk 1's frames vs chunk 2's
    assert near < 6 and other > 3 * near, (near, other)
    status, err = call(app, "GET", f"/v1/videos/{job['id']}/chunks/x1")
    assert status == 400 and err["error"]["param"] == "index", err
    assert "index='x1'" in err["error"]["message"] and "\n" not in err["error"]["message"]
    status, err = call(app, "GET", f"/v1/videos/{job['id']}/chunks/4")
    assert status == 404 and "4 chunk(s)" in err["error"]["message"], err
