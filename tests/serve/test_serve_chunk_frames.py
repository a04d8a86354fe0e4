"""A causal job's chunk frames in the server's memory (:mod:`ditax.serve.chunks`, issue 59
item 3), without a model: a chunk's frames are one JPEG of its frames stacked top to bottom
(within JPEG's error of the frames), the log keeps them for the last ``KEEP_FRAMES`` jobs only
(older jobs' chunk events lose their ``url``; their frames: a 404 that names the mp4), and a
chunk number that is no integer is a 400 in one line."""

from __future__ import annotations

import io

import numpy as np
import PIL.Image

from ditax.serve.chunks import KEEP_FRAMES, ChunkLog, chunk_frames, frame_strip


def decode(strip: bytes) -> np.ndarray:
    return np.asarray(PIL.Image.open(io.BytesIO(strip)).convert("RGB"))


def test_strip_is_the_frames_top_to_bottom():
    y, x = np.mgrid[0:32, 0:48] / 48.0
    frames = np.stack([np.stack([y, x, np.full_like(x, k / 4)], -1) for k in range(5)])
    got = decode(frame_strip(frames.astype(np.float32))).reshape(5, 32, 48, 3)
    want = np.round(frames * 255)
    assert np.abs(got - want).mean() < 2.0             # JPEG at quality 90 on smooth ramps
    assert np.abs(got[1:] - want[:-1]).mean() > 10     # each frame in its own place


def test_log_keeps_the_last_jobs_frames():
    log = ChunkLog()
    pixels = np.zeros((2, 8, 8, 3), np.uint8)
    ids = [f"video_{i:032x}" for i in range(KEEP_FRAMES + 1)]
    for job_id in ids:
        for index in range(2):
            log.add(job_id, index, 2 * index + 2, 50, frame_strip(pixels + index))
    old, new = ids[0], ids[-1]
    assert all("url" not in c for c in log.since(old, 0))
    assert [(c["first"], c["count"], c["url"]) for c in log.since(new, 0)] == [
        (0, 2, f"/v1/videos/{new}/chunks/0"), (2, 2, f"/v1/videos/{new}/chunks/1")]
    assert decode(chunk_frames(log, {"id": new}, "1")).shape == (16, 8, 3)
    status, message, param = chunk_frames(log, {"id": old, "status": "completed"}, "0")
    assert status == 404 and "no longer kept" in message and f"{old}/content" in message
    status, message, param = chunk_frames(log, {"id": new, "status": "in_progress"}, "2")
    assert status == 404 and "2 chunk(s)" in message and "in_progress" in message
    for bad in ("-1", "one", "1.0", "9" * 7):
        status, message, param = chunk_frames(log, {"id": new, "status": "completed"}, bad)
        assert (status, param) == (400, "index") and "\n" not in message, (bad, message)
    log.drop(new)          # a job back in the queue starts over
    assert log.since(new, 0) == [] and log.strip(new, 0) is None
