"""``ditax serve`` stopped by a signal during a long job (issue 41, class 9), and jobs that
belong to their model folder's files (class 2).

SIGTERM while a job runs past ``--drain``: the job goes back to the queue at its next step
(queued, progress 0), the process says so in one line and exits 0 — no ``FATAL: exception not
rethrown`` from the worker thread torn down inside XLA — and the next server on the store runs
the job; Ctrl-C twice ends the drain at once, the same way. A server started on the same folder
path whose files changed (weights replaced) leaves the old files' queued jobs queued and says
how many and why; once the files are back, they run.
"""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import time

from serve_fixtures import LONG, SMALL, Server, mp4_frames

from ditax.cli import model_arg


def rows(db) -> dict[str, tuple]:
    with sqlite3.connect(db) as con:
        return {r[0]: r[1:] for r in con.execute("SELECT id, status, progress FROM jobs")}


def closed(srv, timeout: float = 30.0) -> None:
    """Wait until ``srv`` no longer accepts connections (a stop signal was handled)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            srv.call("GET", "/health")
        except OSError:
            return
        time.sleep(0.02)
    raise AssertionError(f"{srv.url} still answers {timeout} s after the signal")


def test_sigterm_past_the_drain_hands_the_job_back(tmp_path, tmp_path_factory):
    # its own compile cache: its servers are stopped mid-job, so none of what they write
    # reaches the modules that compare a served video with `ditax generate` bit for bit
    cache = tmp_path / "compile_cache"
    model = tmp_path / "model"
    shutil.copytree(model_arg("demo"), model)
    db = tmp_path / "jobs.sqlite"
    first = Server(tmp_path / "a", "--drain", "0.5", "--max-batch", "1", db=db, cache=cache,
                   model=model).start()
    try:
        long = first.submit(seed=5, **{**LONG, "num_inference_steps": 120})["id"]
        short = first.submit(seed=6, **SMALL)["id"]
        job = first.wait(long, ("in_progress",), poll=0.01)
        while job["status"] == "in_progress" and job["progress"] == 0:
            job = first.call("GET", f"/v1/videos/{long}")[2]
        assert job["status"] == "in_progress", f"the job ended before the signal: {job}"
        code = first.stop(signal.SIGTERM)
    finally:
        first.stop(signal.SIGKILL)
    log = first.log.read_text()
    assert code == 0, log[-3000:]
    assert "FATAL" not in log and "Traceback" not in log, log[-3000:]
    assert f"stopping: job {long} handed back to the queue after the 0.5 s drain" in log, log
    assert rows(db) == {long: ("queued", 0), short: ("queued", 0)}

    # the weights replaced (the same bytes, a new file): the old files' jobs stay queued
    weights = model / "transformer" / "diffusion_pytorch_model.safetensors"
    stat = weights.stat()
    shutil.copyfile(weights, tmp_path / "w")
    os.replace(tmp_path / "w", weights)
    changed = Server(tmp_path / "b", db=db, cache=cache, model=model).start()
    try:
        fresh = changed.wait(changed.submit(seed=7, **SMALL)["id"])
        assert fresh["status"] == "completed", fresh
        assert [changed.call("GET", f"/v1/videos/{i}")[2]["status"] for i in (long, short)] \
            == ["queued", "queued"]
        # Ctrl-C twice mid-job (the default 10 s drain, ended by the second): handed back
        # (uvicorn's own second-signal exit skipped the worker's stop: FATAL, the job left
        # in_progress)
        cut = changed.submit(seed=8, **{**LONG, "num_inference_steps": 200})["id"]
        job = changed.wait(cut, ("in_progress",), poll=0.01)
        while job["status"] == "in_progress" and job["progress"] == 0:
            job = changed.call("GET", f"/v1/videos/{cut}")[2]
        assert job["status"] == "in_progress", f"the job ended before the signal: {job}"
        changed.proc.send_signal(signal.SIGINT)
        closed(changed)             # the first handled (two at once would count as one)
        code = changed.stop(signal.SIGINT)
    finally:
        changed.stop(signal.SIGKILL)
    log = changed.log.read_text()
    assert code == 0, log[-3000:]
    assert "FATAL" not in log and "Traceback" not in log, log[-3000:]
    assert f"2 queued job(s) in {db} were submitted to {model.resolve()} when its files " \
           f"were different" in log, log
    assert f"stopping: job {cut} handed back to the queue (a second signal ended the 10 s " \
           f"drain)" in log, log
    assert rows(db)[cut] == ("queued", 0)

    # the files as they were: the next server runs both, their content downloadable
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    again = Server(tmp_path / "c", db=db, cache=cache, model=model).start()
    try:
        done = [again.wait(i, timeout=300) for i in (long, short)]
        assert [j["status"] for j in done] == ["completed"] * 2, done
        assert done[0]["attempts"] == 2, done[0]                 # stopped once, then run
        frames = [mp4_frames(again.call("GET", j["url"])[2], tmp_path) for j in done]
        assert [f.shape for f in frames] == [(5, 32, 32, 3)] * 2
    finally:
        again.stop()
    log = again.log.read_text()
    assert "FATAL" not in log
    # the job submitted to the replaced files stays queued for them
    assert f"1 queued job(s) in {db} were submitted to {model.resolve()}" in log, log
    assert rows(db)[cut] == ("queued", 0)


def test_a_store_without_the_hash_column_opens_and_its_jobs_run(tmp_path):
    """A store an earlier ditax serve made (no ``model_hash`` column) opens; its jobs carry no
    files hash and are claimed by the server of their model."""
    from ditax.serve.jobs import JobStore
    from ditax.serve.model_hash import folder_hash

    db = tmp_path / "old.sqlite"
    with sqlite3.connect(db) as con:
        con.executescript(
            "CREATE TABLE jobs (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL,"
            " created_at REAL NOT NULL, status TEXT NOT NULL, progress INTEGER NOT NULL "
            "DEFAULT 0, request TEXT NOT NULL, batch_key TEXT NOT NULL, error TEXT, file TEXT,"
            " attempts INTEGER NOT NULL DEFAULT 0, batch_size INTEGER, compiles INTEGER, "
            "started_at REAL, finished_at REAL, seconds REAL, model TEXT, warnings TEXT);"
            "INSERT INTO jobs (id, created_at, status, request, batch_key, model) VALUES "
            "('video_old', 0, 'queued', '{}', 'k', 'm');")
    folder = tmp_path / "m"
    (folder / "transformer").mkdir(parents=True)
    (folder / "model_index.json").write_text("{}")
    (folder / "transformer" / "w.safetensors").write_bytes(b"0" * 8)
    files = folder_hash(folder)
    store = JobStore(db, model="m", model_hash=files)
    assert [j["id"] for j in store.claim(4)] == ["video_old"]    # no hash: its model's
    new = store.add({}, "k", 4)
    assert new["model_hash"] == files
    # the hash follows the files (a config's content, a weight's size); a server on the changed
    # folder leaves the job queued and counts it
    (folder / "model_index.json").write_text('{"a": 1}')
    edited = folder_hash(folder)
    assert edited != files
    (folder / "transformer" / "w.safetensors").write_bytes(b"0" * 9)
    assert folder_hash(folder) not in (files, edited)
    store.close()
    changed = JobStore(db, model="m", model_hash=folder_hash(folder))
    assert changed.claim(4) == [] and changed.changed() == {files: 1}
