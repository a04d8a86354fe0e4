"""``ditax serve --batching static`` by two processes (2 x 4 CPU devices, gloo) on one mesh of
8 that splits the batch (fsdp 2 x context 4): a batch of two jobs runs all its steps (each
step's latents and sampler state come back laid out as the step program took them, not split
over fsdp) and each job's video is its own seed's — equal to that seed run alone on the same
group."""

from __future__ import annotations

import concurrent.futures

import pytest
from serve_fixtures import Server, assert_same_video, free_port, mp4_frames
from test_serve_multihost import FOUR, MESH, group_args, start_follower

REQUEST = {"size": "64x64", "num_frames": 5, "num_inference_steps": 3}


@pytest.mark.slow
def test_two_processes_run_a_static_batch_on_a_batch_sharded_mesh(tmp_path):
    port = free_port()
    static = ["--batching", "static", "--max-batch", "2", "--warm", "64x64x5:3"]
    follower = start_follower(tmp_path / "group", port)   # it takes the leader's batching
    leader = Server(tmp_path / "group", *static, *MESH, *group_args(port, 0), env=FOUR)
    try:
        leader.start(240)
        seeds = [11, 12, 13, 14]
        with concurrent.futures.ThreadPoolExecutor(len(seeds)) as pool:
            ids = list(pool.map(lambda s: leader.submit(**REQUEST, seed=s)["id"], seeds))
        done = [leader.wait(i, timeout=240) for i in ids]
        assert [d["status"] for d in done] == ["completed"] * len(seeds), \
            [d["error"] for d in done]
        batched = [d for d in done if d["batch_size"] == 2]
        assert batched, [d["batch_size"] for d in done]
        alone = leader.wait(leader.submit(**REQUEST, seed=batched[0]["seed"])["id"],
                            timeout=240)
        assert alone["status"] == "completed" and alone["batch_size"] == 1, alone
        a, b = (mp4_frames(leader.call("GET", d["url"])[2], tmp_path).astype(int)
                for d in (batched[0], alone))
        assert_same_video(a, b)
        other = next(d for d in done if d["id"] != batched[0]["id"])
        c = mp4_frames(leader.call("GET", other["url"])[2], tmp_path).astype(int)
        assert abs(a - c).mean() > 1, "two seeds gave one video"
        assert leader.stop() == 0, leader.log.read_text()[-3000:]
    finally:
        for p in (follower, leader.proc):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
