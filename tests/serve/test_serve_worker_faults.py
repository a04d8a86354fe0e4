"""A worker never dies silently (issue 41, class 3): a job whose output cannot be written (the
output folder replaced by a file) fails with a message naming the path, the worker goes on
with the next jobs, and ``/health`` says ok while the worker lives."""

import shutil

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
        done = srv.wait(srv.submit(prompt=PROMPT, seed=2, num_inference_steps=2)["id"])
        assert done["status"] == "completed", done
        assert srv.call("GET", done["url"])[0] == 200
    finally:
        srv.stop()
