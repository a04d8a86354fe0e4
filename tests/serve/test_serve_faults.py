"""``ditax serve`` under faults: ``kill -9`` mid-job then a restart with the same ``--db`` (every
accepted job ends completed or failed with a reason, no half-written file), SIGTERM (exit 0,
the running job back in the queue), a full queue (429 + Retry-After), the API key (401), and
the store's recovery rule (a job interrupted too often fails with the reason); LoRA switching
(``--lora-dir``: a request's strength changes the video, compiles nothing, and equals ``ditax
generate --lora FILE:S --lora-mode unmerged`` with the same seed)."""

from __future__ import annotations

import signal
import sqlite3

import numpy as np
import pytest
from serve_fixtures import LONG, PROMPT, Server, mp4_frames, shared_cache, write_lora

KEY = {"Authorization": "Bearer s3cret"}


def statuses(db) -> dict[str, str]:
    with sqlite3.connect(db) as con:
        return dict(con.execute("SELECT id, status FROM jobs"))


def test_auth_queue_full_kill9_restart_sigterm(tmp_path_factory, tmp_path, capsys):
    folder = tmp_path_factory.mktemp("serve_faults")
    (folder / "loras").mkdir()
    write_lora(folder / "loras" / "tiny.safetensors")
    srv = Server(folder, "--api-key", "s3cret", "--max-queue", "3", "--max-batch", "1",
                 "--drain", "0", "--lora-dir", str(folder / "loras"),
                 cache=shared_cache(tmp_path_factory)).start()
    try:
        # auth: every route but /health needs the key
        assert srv.call("GET", "/health")[0] == 200
        for headers in (None, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            status, head, data = srv.call("GET", "/v1/videos", headers=headers)
            assert status == 401 and head.get("www-authenticate") == "Bearer", data
        assert srv.call("POST", "/v1/videos", {"prompt": PROMPT})[0] == 401
        assert srv.call("GET", "/metrics")[0] == 401
        # three accepted jobs fill the queue; the fourth gets 429 with Retry-After
        ids = [srv.submit(headers=KEY, seed=s, **LONG)["id"] for s in range(3)]
        status, head, data = srv.call("POST", "/v1/videos", {"prompt": PROMPT, **LONG}, KEY)
        assert status == 429 and int(head["retry-after"]) >= 1, data
        assert "--max-queue 3" in data["error"]["message"]
        # killed mid-denoise (its programs compiled and in the cache: the restart reads them)
        job = srv.wait(ids[0], ("in_progress",), headers=KEY, poll=0.01)
        while job["status"] == "in_progress" and job["progress"] == 0:
            job = srv.call("GET", f"/v1/videos/{ids[0]}", headers=KEY)[2]
        assert job["status"] == "in_progress", f"the job ended before the kill: {job}"
        srv.stop(signal.SIGKILL)
        assert statuses(srv.db)[ids[0]] == "in_progress"      # killed while it ran
        # restart: every accepted job ends completed (or failed with a reason)
        srv.start()
        done = [srv.wait(i, headers=KEY) for i in ids]
        for job in done:
            assert job["status"] == "completed" or job["error"]["message"], job
        assert [j["status"] for j in done] == ["completed"] * 3, [j["error"] for j in done]
        assert done[0]["attempts"] == 2                         # it ran again after the kill
        for job in done:
            status, _, data = srv.call("GET", job["url"], headers=KEY)
            assert status == 200 and mp4_frames(data, tmp_path).shape == (5, 32, 32, 3)
        assert not list(srv.out.glob(".*partial*"))             # no half-written file left
        # LoRA switching: listed, a name outside the folder refused, strength 1 changes the
        # video of the same seed and compiles nothing (unmerged: only values change)
        _, _, listed = srv.call("GET", "/v1/loras", headers=KEY)
        assert [d["name"] for d in listed["data"]] == ["tiny"]
        status, _, data = srv.call("POST", "/v1/videos", {"prompt": PROMPT, **LONG, "loras": [
            {"name": "../tiny"}]}, KEY)
        assert status == 400 and data["error"]["param"] == "loras", data
        lora = srv.wait(srv.submit(headers=KEY, seed=0, loras=[{"name": "tiny", "strength": 1}],
                                   **LONG)["id"], headers=KEY)
        assert lora["status"] == "completed" and lora["compiles"] == 0, lora
        plain, styled = (mp4_frames(srv.call("GET", j["url"], headers=KEY)[2], tmp_path)
                         for j in (done[0], lora))
        assert np.abs(plain.astype(int) - styled.astype(int)).max() > 10
        # ... and equals ditax generate with the LoRA loaded unmerged at that strength (the
        # same seed; the server's compile cache): the same mp4, byte for byte
        from ditax.cli import main

        out = tmp_path / "lora.mp4"
        assert main(["generate", "--model", "demo", "--prompt", PROMPT, "--width", "32",
                     "--height", "32", "--frames", str(LONG["num_frames"]), "--steps",
                     str(LONG["num_inference_steps"]), "--seed", "0", "--lora",
                     f"{folder / 'loras' / 'tiny.safetensors'}:1", "--lora-mode", "unmerged",
                     "--output", str(out), "--no-progress", f"compile_cache={srv.cache}"]) == 0
        capsys.readouterr()
        served = srv.call("GET", lora["url"], headers=KEY)[2]
        np.testing.assert_array_equal(styled, mp4_frames(out.read_bytes(), tmp_path))
        assert served == out.read_bytes()
        # SIGTERM mid-job (--drain 0): exit 0, the running job back in the queue at its next
        # step (the next start runs it)
        last = srv.submit(headers=KEY, seed=9, **LONG)["id"]
        srv.wait(last, ("in_progress",), headers=KEY, poll=0.01)
        assert srv.stop(signal.SIGTERM) == 0, srv.log.read_text()[-2000:]
        after_term = statuses(srv.db)
        assert after_term[last] in ("queued", "completed"), after_term
        assert "in_progress" not in after_term.values(), after_term
        assert (f"stopping: job {last} handed back to the queue after the 0 s drain"
                in srv.log.read_text() or after_term[last] == "completed")
    finally:
        srv.stop()


def test_a_job_interrupted_too_often_fails_with_the_reason(tmp_path):
    from ditax.serve.jobs import MAX_ATTEMPTS, JobStore, QueueFull

    store = JobStore(tmp_path / "jobs.sqlite")
    job = store.add({"prompt": "x"}, None, max_queue=4)
    for _ in range(MAX_ATTEMPTS):
        assert [j["id"] for j in store.claim(4)] == [job["id"]]
        requeued, failed = store.recover()                       # as after a kill -9
    assert failed == [job["id"]] and requeued == []
    row = store.get(job["id"])
    assert row["status"] == "failed" and "the server stopped while this job ran" in row["error"]
    assert store.claim(4) == []
    # a recovered store keeps the order and the batch keys
    a, b = (store.add({"prompt": p}, "k", 4)["id"] for p in "ab")
    c = store.add({"prompt": "c"}, None, 4)["id"]
    assert [j["id"] for j in store.claim(4)] == [a, b]
    assert [j["id"] for j in store.claim(4)] == [c]
    with pytest.raises(QueueFull):                              # a, b, c unfinished
        store.add({"prompt": "d"}, None, max_queue=3)
