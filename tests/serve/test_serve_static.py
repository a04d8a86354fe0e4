"""``ditax serve --batching static``: queued jobs of one shape run as one lock-step batch
(padded to a power of two, at most ``--max-batch``), each job gets its own seed's video (a
batched job's equals its request alone), none is lost, and the log says each warm-up batch
size."""

from __future__ import annotations

import concurrent.futures

from serve_fixtures import SMALL, Server, assert_same_video, mp4_frames, shared_cache

SPEC = f"{SMALL['size']}x{SMALL['num_frames']}:{SMALL['num_inference_steps']}"


def test_static_batches_keep_each_jobs_own_video(tmp_path_factory, tmp_path):
    srv = Server(tmp_path_factory.mktemp("serve_static"), "--batching", "static",
                 "--max-batch", "4", "--max-queue", "32", "--warm", SPEC,
                 cache=shared_cache(tmp_path_factory)).start(timeout=120)
    try:
        seeds = list(range(300, 310))
        with concurrent.futures.ThreadPoolExecutor(len(seeds)) as pool:
            ids = list(pool.map(lambda s: srv.submit(seed=s)["id"], seeds))
        done = [srv.wait(i) for i in ids]
        assert [d["status"] for d in done] == ["completed"] * len(seeds), \
            [d["error"] for d in done]
        assert [d["seed"] for d in done] == seeds
        sizes = [d["batch_size"] for d in done]
        assert max(sizes) > 1 and max(sizes) <= 4, sizes
        assert [d["compiles"] for d in done] == [0] * len(seeds), (sizes, done)
        log = srv.log.read_text()
        for b in (1, 2, 4):
            assert f"warm: batch size {b} in " in log, log[-2000:]
        # a batched job's video is its own seed's: equal to it alone, not to its neighbour's
        batched = next(d for d in done if d["batch_size"] > 1)
        alone = srv.wait(srv.submit(seed=batched["seed"])["id"])
        assert alone["status"] == "completed" and alone["batch_size"] == 1, alone
        a = mp4_frames(srv.call("GET", batched["url"])[2], tmp_path).astype(int)
        b = mp4_frames(srv.call("GET", alone["url"])[2], tmp_path).astype(int)
        assert_same_video(a, b)
        other = next(d for d in done if d["batch_size"] > 1 and d["id"] != batched["id"])
        c = mp4_frames(srv.call("GET", other["url"])[2], tmp_path).astype(int)
        assert abs(a - c).mean() > 1, "two seeds of one batch gave one video"
    finally:
        assert srv.stop() == 0, srv.log.read_text()[-2000:]
