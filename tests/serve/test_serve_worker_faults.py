"""A worker never dies silently (issue 41, class 3): a job whose output cannot be written (the
output folder replaced by a file) fails with a message naming the path, the worker goes on
with the next jobs, and ``/health`` says ok while the worker lives; a prompt cut to the text
length completes with the warning in its job (class 4); a job belongs to its model and a store
to one server (class 2)."""

import shutil
import subprocess
import sys

from serve_fixtures import PROMPT, Server, shared_cache


def test_an_unwritable_output_fails_the_job_not_the_worker(tmp_path, tmp_path_factory):
    srv = Server(tmp_path / "srv", cache=shared_cache(tmp_path_factory)).start()
    try:
        # the folder is replaced while the job runs (submit checked it: it was a folder then)
        job = srv.submit(prompt=PROMPT, seed=1, num_inference_steps=25)
        shutil.rmtree(srv.out)
        srv.out.write_text("a file where the videos go")
        failed = srv.wait(job["id"])
        assert failed["status"] == "failed", failed
        assert "could not write" in failed["error"]["message"], failed
        assert str(srv.out) in failed["error"]["message"], failed
        status, _, health = srv.call("GET", "/health")
        assert status == 200 and health["status"] == "ok", health
        srv.out.unlink()
        srv.out.mkdir()
        # a prompt past the folder's text length (the demo's 16 tokens) completes and says so
        long = PROMPT + " over a field of tall green grass while the sun sets slowly" * 2
        done = srv.wait(srv.submit(prompt=long, seed=2, num_inference_steps=2)["id"])
        assert done["status"] == "completed", done
        assert srv.call("GET", done["url"])[0] == 200
        assert len(done["warnings"]) == 1, done
        assert "more than max_sequence_length=16" in done["warnings"][0], done
        assert srv.wait(srv.submit(seed=3)["id"])["warnings"] == []
    finally:
        srv.stop()


def test_a_job_belongs_to_its_model_and_a_store_to_one_server(tmp_path, tmp_path_factory):
    """Two servers on one --db: the second is refused before it loads or claims anything (the
    first's jobs run once); a server on a port in use is refused before it claims anything; a
    restart with another model leaves the first model's queued jobs queued."""
    import pytest

    cache = shared_cache(tmp_path_factory)
    db = tmp_path / "jobs.sqlite"
    first = Server(tmp_path / "a", "--drain", "0", db=db, cache=cache).start()
    try:
        job = first.submit(seed=1)
        with pytest.raises(RuntimeError, match=r"is served by another ditax serve \(pid \d+\)"):
            Server(tmp_path / "b", db=db, cache=cache).start()
        busy = subprocess.run(
            [sys.executable, "-m", "ditax.cli", "serve", "--model", "demo", "--port",
             str(first.port), "--db", str(tmp_path / "c.sqlite"), "--no-progress"],
            capture_output=True, text=True, timeout=120)
        assert busy.returncode == 2 and "cannot listen there" in busy.stderr, busy.stderr
        assert first.wait(job["id"])["status"] == "completed"
        assert first.wait(job["id"])["attempts"] == 1          # run once, by its server
        queued = first.submit(seed=2, num_inference_steps=200)   # handed back (--drain 0)
    finally:
        first.stop()
    other = Server(tmp_path / "d", db=db, cache=cache, model="flux-demo").start()
    try:
        status, _, row = other.call("GET", f"/v1/videos/{queued['id']}")
        assert status == 200 and row["status"] == "queued", row
        assert "another model's; they stay queued" in other.log.read_text()
    finally:
        other.stop()
