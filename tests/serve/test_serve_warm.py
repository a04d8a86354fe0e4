"""``ditax serve --warm``: nothing compiles on the request path, and ``/metrics``.

A server started with ``--warm`` of the test request's size answers ``/health`` at once with
503 ``"warming"`` (``ditax_ready 0``) while it compiles, then 200 ``"ok"``; its first jobs of
that size — alone or batched — compile nothing (their ``compiles`` is 0). A second start on the
same compile cache reads every program from it (cache hits, faster). ``/metrics`` parses as
Prometheus text (``prometheus_client``'s parser): ready, queue depth, the running rows, the
step-time histogram agreeing with the step counter, jobs completed / failed / retried /
cancelled, compiles and cache hits. A bad ``--warm`` is one line and exit 2 before the model
loads.
"""

from __future__ import annotations

import concurrent.futures
import re
import threading
import time

import pytest
from serve_fixtures import SMALL, Server, request

SPEC = f"{SMALL['size']}x{SMALL['num_frames']}:{SMALL['num_inference_steps']}"


def start_watching(srv: Server) -> list[tuple[int, dict, bytes]]:
    """Start ``srv`` (waits for ``/health`` 200) while another thread records each
    ``(status, /health, /metrics)`` it answers on the way."""
    seen, done = [], threading.Event()

    def watch():
        while srv.proc is None and not done.is_set():
            time.sleep(0.01)
        while not done.is_set():
            try:
                status, _, health = request(srv.url, "GET", "/health")
                seen.append((status, health, request(srv.url, "GET", "/metrics")[2]))
            except OSError:               # not listening yet
                pass
            time.sleep(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        srv.start(timeout=120)
    finally:
        done.set()
        thread.join()
    return seen


def families(text: bytes) -> dict:
    """``{sample name + labels: value}`` of a Prometheus text exposition, strictly parsed."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[s.name + (f"{{{labels}}}" if labels else "")] = s.value
    return out


def test_warm_start_compiles_nothing_on_the_request_path(tmp_path):
    cache = tmp_path / "compile_cache"      # its own: the first start compiles, the second reads
    args = ("--warm", SPEC, "--max-batch", "2")
    first = Server(tmp_path / "first", *args, cache=cache)
    seen = start_watching(first)
    try:
        warming = [(s, h, m) for s, h, m in seen if s == 503]
        assert warming, f"no /health answer while it compiled: {seen}"
        status, health, metrics = warming[0]
        assert health["status"] == "warming" and health["ready"] is False, health
        assert health["warming"] == [SPEC], health
        assert families(metrics)["ditax_ready"] == 0
        status, _, health = first.call("GET", "/health")
        assert status == 200 and health["status"] == "ok" and health["ready"] is True, health
        assert health["warmed"] == [SPEC] and health["warm_programs"] > 0, health
        assert health["warm_cache_hits"] == 0 and health["warm_seconds"] > 0, health
        compile_seconds = families(first.call("GET", "/metrics")[2])[
            "ditax_compile_seconds_total"]
        line = re.search(r"^warm: compiled (\d+) programs for (\S+) in ([\d.]+) s \(compile "
                         r"cache hits (\d+)\)$", first.log.read_text(), re.M)
        assert line and line.groups()[:2] == (str(health["warm_programs"]), SPEC), \
            first.log.read_text()[-2000:]
        # the first job of that size compiles nothing (nor does the process meanwhile)
        job = first.wait(first.submit(seed=1)["id"])
        assert job["status"] == "completed" and job["compiles"] == 0, job
        got = families(first.call("GET", "/metrics")[2])
        assert got["ditax_ready"] == 1 and got["ditax_compiles_total"] == health["warm_programs"]
        assert got["ditax_jobs_completed_total"] == 1 and got["ditax_queue_depth"] == 0
        assert got['ditax_jobs{status="completed"}'] == 1 and got["ditax_running_rows"] == 0
        for name in ("failed", "retried", "cancelled"):
            assert got[f"ditax_jobs_{name}_total"] == 0
        # the step-time histogram: cumulative buckets ending at +Inf = _count = steps run
        buckets = sorted((float(k.split('"')[1]), v) for k, v in got.items()
                         if k.startswith("ditax_step_seconds_bucket"))
        counts = [v for _, v in buckets]
        assert buckets[-1][0] == float("inf") and counts == sorted(counts), buckets
        assert counts[-1] == got["ditax_step_seconds_count"] == got["ditax_steps_total"] > 0
        assert got["ditax_step_seconds_sum"] > 0
        assert got["ditax_compile_cache_hits_total"] == 0
    finally:
        assert first.stop() == 0, first.log.read_text()[-2000:]
    # a second server on the same compile cache reads the programs instead of compiling them
    second = Server(tmp_path / "second", *args, cache=cache).start(timeout=120)
    try:
        again = second.call("GET", "/health")[2]
        assert again["warm_programs"] == health["warm_programs"], again
        assert 0 < again["warm_cache_hits"] <= again["warm_programs"], again
        # faster: reading a program is cheaper than compiling it (the XLA seconds, not the
        # wall clock, which the warm-up's runs and a busy machine blur)
        read_seconds = families(second.call("GET", "/metrics")[2])["ditax_compile_seconds_total"]
        assert read_seconds < compile_seconds, (read_seconds, compile_seconds)
        # jobs that run side by side (any batch up to --max-batch 2) compile nothing either
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            jobs = list(pool.map(lambda seed: second.wait(second.submit(seed=seed)["id"]),
                                 (2, 3, 4)))
        assert all(j["status"] == "completed" for j in jobs), jobs
        assert [j["compiles"] for j in jobs] == [0, 0, 0], \
            [(j["batch_size"], j["compiles"]) for j in jobs]
    finally:
        assert second.stop() == 0, second.log.read_text()[-2000:]


@pytest.mark.parametrize("model, warm, words", [
    ("demo", "32x32x5x9", "argument --warm: '32x32x5x9' is not WIDTHxHEIGHTxFRAMES[:STEPS]"),
    ("demo", "32x32x5,", "argument --warm: '' is not WIDTHxHEIGHTxFRAMES[:STEPS]"),
    ("demo", "32x32x6", "--warm 32x32x6: num_frames=6 must be of the form 4k+1"),
    ("demo", "4096x4096x5", "--warm 4096x4096x5: size=4096x4096 is 16777216 pixels, more "
     "than this server's --max-pixels"),
    ("demo", "32x32x5:500", "--warm 32x32x5:500: num_inference_steps=500 is more than this "
     "server's --max-steps 200"),
    ("flux-demo", "32x32x5", "--warm 32x32x5: this model makes images, which have no frames"),
])
def test_bad_warm_is_one_line_before_loading(tmp_path, capsys, model, warm, words):
    from ditax.cli import main

    code = main(["serve", "--model", model, "--warm", warm, "--db",
                 str(tmp_path / "jobs.sqlite"), "--port", "0", "--no-progress"])
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("ditax serve: error: ") and words in err, err
    assert "loaded" not in captured.out and "serving" not in captured.out, captured.out


def test_static_warm_says_each_batch_size_and_the_one_that_failed(monkeypatch):
    """A static server's warm-up covers every padded batch size (1, 2, 4, 8 for
    ``--max-batch 8``) without running a step: each size's batch runs dry while its step
    program is noted, then the noted programs compile side by side (four threads: a barrier of
    four that serial builds would break), then the first two sizes run dry again with their
    row decoded. Its log has each size's seconds, and the size that failed (its exception goes
    on to ``/health``'s ``warm_error``), in size order though the builds ran together."""
    import types

    from ditax.pipelines.programs import Programs
    from ditax.serve import batch

    programs, together = Programs(), threading.Barrier(4, timeout=10)

    class Pipe:
        batches = True

        def prepare(self, **call):
            return types.SimpleNamespace(cache=None, programs=programs)

    ran = []

    def build(b):
        together.wait()             # every size's build at once, or BrokenBarrierError
        if b == 8:
            raise RuntimeError("RESOURCE_EXHAUSTED: out of memory at 8 rows")
        return f"step program of {b} rows"

    def generate_batch(pipe, calls, pad_to=None, dry=False, decoded=True):
        program = programs.get(("step", pad_to), lambda: build(pad_to))
        ran.append((pad_to, dry, decoded, program))

    monkeypatch.setattr(batch, "generate_batch", generate_batch)
    said = []
    with pytest.raises(RuntimeError, match="RESOURCE_EXHAUSTED"):
        batch.warm_programs(Pipe(), [{"prompt": "p"}], 8, say=said.append)
    assert batch.buckets(8) == [1, 2, 4, 8]
    assert ran == [(b, True, False, None) for b in (1, 2, 4, 8)] + [
        (1, True, True, "step program of 1 rows"), (2, True, True, "step program of 2 rows")]
    assert [re.sub(r"[\d.]+ s", "S", m) for m in said] == [
        "warm: batch size 1 in S (no step run; 4 compile threads)",
        "warm: batch size 2 in S (no step run; 4 compile threads)",
        "warm: batch size 4 in S (no step run; 4 compile threads)",
        "warm: batch size 8 (of 1, 2, 4, 8) failed after S"]


def test_static_warm_runs_step_cached_requests(monkeypatch):
    """A step-cached request's steps decide per step what runs, so its static warm-up runs it
    whole at each size, as does a server of one size (``--max-batch 1``, ``--batching off``)."""
    import types

    from ditax.serve import batch

    class Pipe:
        batches = True
        cache = "teacache"

        def prepare(self, **call):
            return types.SimpleNamespace(cache=self.cache, programs=None)

    ran = []
    monkeypatch.setattr(batch, "generate_batch",
                        lambda pipe, calls, pad_to=None, **dry: ran.append((pad_to, dry)))
    batch.warm_programs(Pipe(), [{"prompt": "p"}], 4)
    assert ran == [(1, {}), (2, {}), (4, {})]
    ran.clear()
    plain = Pipe()
    plain.cache = None
    batch.warm_programs(plain, [{"prompt": "p"}], 1)
    assert ran == [(1, {})]
