"""One model served by two processes (``ditax serve ... mesh.num_processes=2 mesh.process_id=K
mesh.coordinator_address=HOST:PORT``, :mod:`ditax.serve.group`): 2 processes x 4 CPU devices
(gloo) on one mesh of 8 (fsdp 2 x context 4, ring attention: the demo model's 5 heads split
nowhere, its 64x64 video's 8 tokens split over 4). The leader's video equals a 1-process
server's (8 devices, the same mesh); a follower killed with -9 while the leader is inside a
step (a collective whose peer is gone never returns) ends the leader within the bound, exit 1
and one line, its running job back in the queue; processes started with other overrides are
refused on both sides (exit 2); bad mesh keys are one line, exit 2."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
from serve_fixtures import Server, assert_same_video, free_port, mp4_frames
from xla_test_flags import xla_flags

MESH = ["mesh.fsdp=2", "mesh.context=4", "attention.backend=ring"]
REQUEST = {"size": "64x64", "num_frames": 5, "num_inference_steps": 2, "seed": 3}
FOUR = {"XLA_FLAGS": xla_flags(4)}        # each process of the group: 4 of the 8 devices
TIMEOUT = 5                               # --process-timeout: a silent follower is lost


def group_args(port: int, k: int) -> list[str]:
    return ["--process-timeout", str(TIMEOUT), "mesh.num_processes=2",
            f"mesh.coordinator_address=127.0.0.1:{port}", f"mesh.process_id={k}"]


def start_follower(folder, port: int, *more: str) -> subprocess.Popen:
    """``ditax serve`` as process 1 (no --db, no --port: it needs neither)."""
    folder.mkdir(parents=True, exist_ok=True)
    log = open(folder / "follower.log", "ab")
    cmd = [sys.executable, "-m", "ditax.cli", "serve", "--model", "demo", "--no-progress",
           *MESH, *group_args(port, 1), *more]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", **FOUR})
    log.close()
    return proc


def status_in_store(db, job_id: str) -> str:
    with sqlite3.connect(db) as con:
        return con.execute("SELECT status FROM jobs WHERE id = ?", (job_id,)).fetchone()[0]


def test_two_processes_serve_the_one_process_video_and_a_lost_follower_ends_the_leader(
        tmp_path):
    port = free_port()
    follower = start_follower(tmp_path / "group", port)
    # --warm: the followers run the leader's warm-up, in the same order (else it never ends)
    leader = Server(tmp_path / "group", "--max-batch", "1", "--warm", "64x64x5:2", *MESH,
                    *group_args(port, 0), env=FOUR)
    alone = Server(tmp_path / "one", *MESH)            # the suite's 8 devices, one process
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            for started in [pool.submit(leader.start, 150), pool.submit(alone.start, 150)]:
                started.result()
        health = leader.call("GET", "/health")[2]
        assert health["devices"] == 8 and health["processes"] == 2, health
        assert health["process_lost"] is None, health
        assert health["ready"] and health["warmed"] == ["64x64x5:2"], health
        jobs = [leader.submit(**REQUEST), alone.submit(**REQUEST)]
        done = [srv.wait(j["id"], timeout=150) for srv, j in zip((leader, alone), jobs)]
        assert [d["status"] for d in done] == ["completed"] * 2, done
        videos = [srv.call("GET", d["url"])[2] for srv, d in zip((leader, alone), done)]
        if videos[0] != videos[1]:       # the same frames, up to the last float bits
            assert_same_video(mp4_frames(videos[0], tmp_path), mp4_frames(videos[1], tmp_path))
        assert alone.stop() == 0

        # kill -9 the follower inside a job: the leader waits in a collective that never ends
        long = leader.submit(**{**REQUEST, "num_inference_steps": 200})
        job = leader.wait(long["id"], ("in_progress",), poll=0.02)
        while job["progress"] < 1:
            job = leader.call("GET", f"/v1/videos/{long['id']}")[2]
        follower.send_signal(signal.SIGKILL)
        t0 = time.monotonic()
        code = leader.proc.wait(60)
        waited = time.monotonic() - t0
        log = leader.log.read_text()
        assert code == 1, log[-3000:]
        assert waited < TIMEOUT + 15, (waited, log[-3000:])
        # the error line names the lost process (the jobs handed back may be said before it)
        errors = [line for line in log.splitlines() if line.startswith("ditax serve: error:")]
        assert errors and errors[0].startswith("ditax serve: error: process 1 of 2 lost"), log
        assert status_in_store(leader.db, long["id"]) == "queued"   # it runs after a restart
    finally:
        for p in (follower, leader.proc, alone.proc):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


def test_processes_with_other_overrides_are_refused_on_both_sides(tmp_path):
    port = free_port()
    follower = start_follower(tmp_path, port, "sample.cfg_mode=sequential")
    leader = subprocess.run(
        [sys.executable, "-m", "ditax.cli", "serve", "--model", "demo", "--no-progress",
         "--db", str(tmp_path / "jobs.sqlite"), "--port", "0", *MESH, *group_args(port, 0)],
        capture_output=True, text=True, timeout=120, env={**os.environ, **FOUR})
    follower.wait(60)
    said = (tmp_path / "follower.log").read_text()
    assert leader.returncode == 2, leader.stderr[-3000:]
    assert "the processes of this server differ — process 1 of 2: overrides" in \
        leader.stderr, leader.stderr
    assert "sample.cfg_mode=sequential" in leader.stderr
    assert follower.returncode == 2, said[-3000:]
    assert "error: process 1 of 2 differs from the leader" in said, said


@pytest.mark.parametrize("keys, words", [
    (["mesh.num_processes=2", "mesh.process_id=2", "mesh.coordinator_address=127.0.0.1:9"],
     "mesh.process_id=2 is out of range: with mesh.num_processes=2 it is 0 (the leader) to 1"),
    (["mesh.num_processes=2", "mesh.process_id=0"],
     "mesh.num_processes=2 needs mesh.coordinator_address=HOST:PORT"),
    (["mesh.process_id=1"], "mesh.process_id=1 needs mesh.num_processes=N"),
    (["mesh.num_processes=2", "mesh.coordinator_address=127.0.0.1:9"],
     "mesh.num_processes=2 needs mesh.process_id=K"),
    (["mesh.num_processes=2", "mesh.process_id=1", "mesh.coordinator_address=somewhere"],
     "mesh.coordinator_address=somewhere is not HOST:PORT"),
])
def test_bad_group_keys_are_one_line(capsys, tmp_path, keys, words):
    from ditax.cli import main

    assert main(["serve", "--model", "demo", "--db", str(tmp_path / "jobs.sqlite"),
                 *keys]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and words in err, err
    assert not (tmp_path / "jobs.sqlite").exists()     # refused before anything opened
