"""``ditax serve`` against a real uvicorn server on 127.0.0.1 with the shipped demo model (tiny
size, 2 steps): submit → poll → download equals ``ditax generate``; the bad requests get
generate's words and their status; 20 concurrent submissions all complete, batched equal to
unbatched; a second same-shape job compiles nothing; cancel, delete, list, health, metrics;
continuous batching: a job submitted while another of its shape runs joins the running batch
at the next step (both report ``batch_size`` 2) and equals the same request alone; with
``--max-wait 0`` a queued job of another shape stops the running batch taking new rows, so it
runs before a later job of the running shape."""

from __future__ import annotations

import concurrent.futures
import re

import pytest
from serve_fixtures import LONG, PROMPT, SMALL, Server, assert_same_video, mp4_frames, shared_cache


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve_api")
    srv = Server(folder, "--max-batch", "4", "--max-queue", "64", "--max-wait", "0",
                 cache=shared_cache(tmp_path_factory)).start()
    yield srv
    assert srv.stop() == 0, srv.log.read_text()[-2000:]


def generate_words(capsys, *flags) -> str:
    """The one error line ``ditax generate`` prints for these flags (exit 2)."""
    from ditax.cli import main

    code = main(["generate", "--model", "demo", "--prompt", PROMPT, "--no-progress", *flags])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    return err.removeprefix("ditax generate: error: ")


def metric(srv, name: str) -> float:
    _, _, text = srv.call("GET", "/metrics")
    m = re.search(rf"^{name} (\S+)$", text.decode(), re.M)
    assert m, text.decode()
    return float(m.group(1))


def test_submit_poll_download_equals_generate(server, tmp_path):
    job = server.submit(seed=7)
    assert job["status"] == "queued" and job["object"] == "video" and job["id"].startswith(
        "video_")
    done = server.wait(job["id"])
    assert done["status"] == "completed", done
    assert done["progress"] == 100 and done["attempts"] == 1
    status, head, data = server.call("GET", done["url"])
    assert status == 200 and head["content-type"] == "video/mp4"
    frames = mp4_frames(data, tmp_path)
    assert frames.shape == (5, 32, 32, 3)
    # ditax generate with the same request and seed (the server's compile cache: no compile),
    # as a user runs it: its own process, not this test process (whose jax state earlier
    # modules of the suite have used)
    import subprocess
    import sys

    out = tmp_path / "generate.mp4"
    run = subprocess.run([sys.executable, "-m", "ditax.cli", "generate", "--model", "demo",
                          "--prompt", PROMPT, "--width", "32", "--height", "32", "--frames", "5",
                          "--steps", "2", "--seed", "7", "--output", str(out), "--no-progress",
                          f"compile_cache={server.cache}"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    # a job that runs alone runs the pipeline's own step: generate's video byte for byte
    assert (frames == mp4_frames(out.read_bytes(), tmp_path)).all()
    assert data == out.read_bytes()
    # a second job of the same shape compiles nothing (per job, and in /metrics)
    before = metric(server, "ditax_compiles_total")
    again = server.wait(server.submit(seed=8)["id"])
    assert again["status"] == "completed" and again["compiles"] == 0, again
    assert metric(server, "ditax_compiles_total") == before


def test_bad_requests_get_generates_words(server, capsys):
    """A bad value gets generate's rule, worded for the API: the JSON field named (never a CLI
    flag), the same rule and fix as ``ditax generate`` prints for its flag."""
    cases = [({"size": "33x32"}, ["--width", "33", "--height", "32"], "size"),
             ({"num_frames": 6}, ["--frames", "6"], "num_frames"),
             ({"seed": -1}, ["--seed", "-1"], "seed"),
             ({"num_inference_steps": 0}, ["--steps", "0"], "num_inference_steps"),
             ({"guidance_scale": -1.5}, ["--guidance", "-1.5"], "guidance_scale")]
    for body, flags, param in cases:
        status, _, data = server.call("POST", "/v1/videos", {"prompt": PROMPT, **body})
        assert status == 400, data
        api, cli = data["error"]["message"], generate_words(capsys, *flags)
        # the same words, the flag (--steps 0, --seed=-1) said as the field (num_inference_steps=0)
        head = next((h for h in (f"{flags[0]} ", f"{flags[0]}=") if cli.startswith(h)), "")
        said = (f"{param}=" + cli[len(head):] if head else cli).replace(flags[0], param)
        assert "--" not in api and api == said, (api, cli)
        assert data["error"]["param"] == param
    status, _, data = server.call("POST", "/v1/videos", {"prompt": " "})
    assert status == 400 and data["error"]["param"] == "prompt"
    assert data["error"]["message"].startswith("prompt is empty")
    for body, param in (({"prompt": PROMPT, "colour": "red"}, "colour"),
                        ({"prompt": PROMPT, "size": "big"}, "size"),
                        ({"prompt": PROMPT, "image": "not base64!"}, "image"),
                        ({"negative_prompt": "x"}, "prompt")):
        status, _, data = server.call("POST", "/v1/videos", body)
        assert status == 400 and data["error"]["param"] == param, data
    status, _, data = server.call("POST", "/v1/videos", b"{not json")
    assert status == 400 and "not JSON" in data["error"]["message"]
    status, _, data = server.call("POST", "/v1/videos", {"prompt": "a " * 1500})
    assert status == 413 and "3000 characters" in data["error"]["message"]
    status, _, data = server.call("POST", "/v1/videos", b"x" * (25 << 20))
    assert status == 413
    status, _, data = server.call("GET", "/v1/videos/video_" + "0" * 32)
    assert status == 404 and "no video" in data["error"]["message"]
    status, _, _ = server.call("GET", "/v1/videos/../../etc/passwd")
    assert status == 404


def test_twenty_concurrent_jobs_batched_equal_unbatched(server, tmp_path):
    seeds = list(range(100, 121))
    with concurrent.futures.ThreadPoolExecutor(21) as pool:
        jobs = list(pool.map(lambda s: server.submit(seed=s), seeds))
    ids = [j["id"] for j in jobs]
    assert len(set(ids)) == 21
    status, _, data = server.call("DELETE", f"/v1/videos/{ids.pop()}")   # queued: cancelled
    assert status == 200 and data["status"] == "cancelled"
    status, _, early = server.call("GET", f"/v1/videos/{ids[-1]}/content")
    assert status == 404 and "its content is there once status is completed" in \
        early["error"]["message"]
    done = [server.wait(i) for i in ids]
    assert [d["status"] for d in done] == ["completed"] * 20, [d["error"] for d in done]
    sizes = [d["batch_size"] for d in done]
    assert max(sizes) > 1 and max(sizes) <= 4, sizes
    # the time each waited before a server took it: part of its time to finish
    assert all(0 <= d["seconds_queued"] <= d["seconds_to_finish"] for d in done), done
    listed, more, after = [], True, None
    while more:
        _, _, page = server.call("GET", "/v1/videos?limit=7" + (f"&after={after}" if after
                                                                else ""))
        listed += [d["id"] for d in page["data"]]
        more, after = page["has_more"], page["last_id"]
    assert listed[:20] == ids[::-1] or set(ids) <= set(listed)   # newest first, none lost
    # a batched job's video equals the same request run alone
    batched = next(d for d in done if d["batch_size"] > 1)
    alone = server.wait(server.submit(seed=batched["seed"])["id"])
    assert alone["batch_size"] == 1
    a = mp4_frames(server.call("GET", batched["url"])[2], tmp_path).astype(int)
    b = mp4_frames(server.call("GET", alone["url"])[2], tmp_path).astype(int)
    assert a.shape == b.shape == (5, 32, 32, 3)
    assert_same_video(a, b)


def test_delete_health_metrics(server):
    _, _, page = server.call("GET", "/v1/videos?limit=100")
    done = next(d for d in page["data"] if d["status"] == "completed")
    assert any(d["status"] == "cancelled" for d in page["data"])
    status, _, data = server.call("DELETE", f"/v1/videos/{done['id']}")
    assert status == 200 and data["deleted"] is True
    status, _, data = server.call("GET", done["url"])
    assert status == 404 and "deleted" in data["error"]["message"]
    assert not (server.out / f"{done['id']}.mp4").exists()
    assert not list(server.out.glob(".*partial*"))
    status, _, health = server.call("GET", "/health")
    assert status == 200 and health["platform"] == "cpu" and health["devices"] >= 1
    assert health["queue_depth"] == 0 and health["model"].endswith("demo_model")
    assert metric(server, 'ditax_jobs{status="cancelled"}') >= 1
    assert metric(server, "ditax_steps_total") > 0
    assert metric(server, "ditax_batched_jobs_total") > metric(server, "ditax_batches_total")


# --- continuous batching (the default --batching continuous; this server's --max-wait 0)
def _running(srv, job_id: str, at_least: int) -> dict:
    """Wait until ``job_id`` runs with progress >= ``at_least`` (a few steps done)."""
    job = srv.wait(job_id, ("in_progress",), poll=0.01)
    while job["status"] == "in_progress" and job["progress"] < at_least:
        job = srv.call("GET", f"/v1/videos/{job_id}")[2]
    assert job["status"] == "in_progress", f"the job ended before the next joined: {job}"
    return job


def test_a_job_joins_the_running_batch_and_equals_alone(server, tmp_path):
    first = server.submit(seed=11, **LONG)
    at = _running(server, first["id"], 10)["progress"]
    joined = server.submit(seed=12, **LONG)
    a, b = server.wait(first["id"]), server.wait(joined["id"])
    assert a["status"] == b["status"] == "completed", (a, b)
    assert a["batch_size"] == b["batch_size"] == 2, (a, b)
    assert 0 < at < 100
    alone = server.wait(server.submit(seed=12, **LONG)["id"])
    assert alone["batch_size"] == 1 and alone["compiles"] == 0, alone
    got = mp4_frames(server.call("GET", b["url"])[2], tmp_path)
    want = mp4_frames(server.call("GET", alone["url"])[2], tmp_path)
    assert_same_video(got, want)
    other = mp4_frames(server.call("GET", a["url"])[2], tmp_path)
    assert abs(other.astype(int) - want.astype(int)).mean() > 0.5    # its own seed reached it


def test_another_shapes_job_stops_the_batch_taking_rows(server):
    running = server.submit(seed=21, **LONG)
    _running(server, running["id"], 10)
    other = server.submit(seed=22, **SMALL)                # 2 steps: another batch key
    later = server.submit(seed=23, **LONG)                 # the running key, after it
    r, o, d = (server.wait(j["id"]) for j in (running, other, later))
    assert [j["status"] for j in (r, o, d)] == ["completed"] * 3, (r, o, d)
    assert r["batch_size"] == 1 and d["batch_size"] == 1, (r, d)   # `later` did not join
    assert r["completed_at"] <= o["completed_at"] <= d["completed_at"], (r, o, d)
