"""A server's results on a full disk (issue 57, item 1): a job whose mp4 ffmpeg could not
finish (exit 0 after ``Error writing trailer: No space left on device``) fails with one line
naming the file and the cause, and none of its files — the mp4, its extra arrays — is left in
the output folder for a client to download; the next job, on a disk with room, completes."""

from __future__ import annotations

import numpy as np

from full_disk import fake_ffmpeg


class Store:
    """The few calls :meth:`Worker.publish` makes of a job store, kept in a dict."""

    def __init__(self, *ids):
        self.rows = {i: {"status": "in_progress", "created_at": 0.0} for i in ids}

    def get(self, job_id):
        return self.rows.get(job_id)

    def finish(self, job_id, status, **fields):
        self.rows[job_id].update(status=status, finished_at=1.0, **fields)
        return True

    def status_of(self, job_id):
        return self.rows[job_id]["status"]


def test_a_job_whose_output_could_not_be_written_fails_and_leaves_no_file(tmp_path,
                                                                          monkeypatch):
    from ditax.serve.worker import Worker

    out = tmp_path / "videos"
    out.mkdir()
    store = Store("j1", "j2")
    worker = Worker(None, store, out, say=lambda _: None)
    result = {"video": np.random.default_rng(0).random((5, 32, 32, 3)).astype(np.float32),
              "latents": np.ones((4, 4), np.float32)}
    with monkeypatch.context() as m:
        m.setenv("IMAGEIO_FFMPEG_EXE", fake_ffmpeg(tmp_path, "trailer"))
        assert worker.publish({"id": "j1", "request": {}}, result, 0, []) is False
    row = store.rows["j1"]
    assert row["status"] == "failed", row
    assert row["error"] == (f"could not write {out / 'j1.mp4'}: no space left on device (the "
                            f"disk is full); ffmpeg: Error writing trailer: No space left on "
                            f"device; free space there or write to another disk (nothing was "
                            f"left under that name)"), row["error"]
    assert list(out.iterdir()) == []
    assert worker.publish({"id": "j2", "request": {}}, result, 0, []) is True
    assert store.rows["j2"]["status"] == "completed"
    assert sorted(p.name for p in out.iterdir()) == ["j2.latents.npy", "j2.mp4"]
