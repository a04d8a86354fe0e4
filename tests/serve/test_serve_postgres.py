"""The PostgreSQL job store (``ditax serve --db postgresql://...``) on a real PostgreSQL server
(:mod:`pg_fixtures`): replicas claiming at once never take one job, an expired lease hands a
job to another replica (whose late twin cannot complete it), a job interrupted
:data:`MAX_ATTEMPTS` times fails, cancelling works across replicas, the batch key and model
rules answer as the SQLite store's, a bad URL or a server that does not answer is one line; and
end to end, two ``ditax serve`` processes on one store and one ``--output-dir``, one of them
``kill -9``-ed while it runs a job: every accepted job completes exactly once, on the other."""

from __future__ import annotations

import collections
import os
import signal
import threading
import time

import pytest
from pg_fixtures import postgres  # noqa: F401 — the session's PostgreSQL server
from serve_fixtures import (LONG, PROMPT, SMALL, Server, assert_same_video, free_port,
                            mp4_frames, shared_cache)

from ditax.errors import ConfigError
from ditax.serve.jobs import MAX_ATTEMPTS, JobStore, QueueFull
from ditax.serve.stores import open_store


def pg(url, **kw):
    from ditax.serve.pgstore import PgJobStore

    return PgJobStore(url, **kw)


@pytest.fixture
def url(postgres):  # noqa: F811
    """A new empty database of the session's server."""
    return postgres.database()


def rows(url) -> dict[str, dict]:
    import psycopg
    from psycopg.rows import dict_row

    with psycopg.connect(url, row_factory=dict_row) as conn:
        return {r["id"]: r for r in conn.execute("SELECT * FROM ditax_jobs")}


def test_replicas_claiming_at_once_never_take_one_job(url):
    a, b = pg(url, model="m"), pg(url, model="m")
    try:
        alone = [a.add({"prompt": f"p{i}"}, None, 1000)["id"] for i in range(60)]
        batched = [b.add({"prompt": f"q{i}"}, "k", 1000)["id"] for i in range(30)]
        got = collections.defaultdict(list)      # store -> ids it claimed
        start = threading.Barrier(8)

        def claim(store, name):
            start.wait()
            while jobs := store.claim(3):
                assert len({j["batch_key"] for j in jobs}) == 1     # one key a claim
                assert all(j["owner"] == store.owner and j["status"] == "in_progress"
                           for j in jobs)
                got[name].extend(j["id"] for j in jobs)

        threads = [threading.Thread(target=claim, args=(s, f"{n}{i}"))
                   for i in range(4) for s, n in ((a, "a"), (b, "b"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        claimed = [i for ids in got.values() for i in ids]
        assert sorted(claimed) == sorted(alone + batched)            # each exactly once
        assert {n[0] for n in got} == {"a", "b"}                     # both replicas claimed
        assert a.counts()["in_progress"] == 90 and a.retried() == 0
        owners = {r["id"]: r["owner"] for r in rows(url).values()}
        for name, ids in got.items():
            assert {owners[i] for i in ids} == {(a if name[0] == "a" else b).owner}
    finally:
        a.close()
        b.close()


def test_an_expired_lease_hands_the_job_to_another_replica(url):
    # a: a replica that stalls (no heartbeat thread); b: a live one
    a, b = pg(url, lease=1.0, beat=False), pg(url, lease=1.0)
    try:
        job = a.add({"prompt": PROMPT}, None, 10)["id"]
        assert [j["id"] for j in a.claim(4)] == [job]
        assert b.claim(4) == []                                  # held by a's lease
        time.sleep(0.7)
        assert a.heartbeat() == 1                                # renewed: still a's
        time.sleep(0.5)
        assert b.claim(4) == []
        time.sleep(1.0)                                          # a's lease has run out
        (taken,) = b.claim(4)
        assert taken["id"] == job and taken["attempts"] == 2 and taken["owner"] == b.owner
        # a's late run may not touch it: no progress, no completion, no hand-back
        a.set_progress(job, 50)
        assert not a.finish(job, "completed", file="late.mp4")
        assert not a.finish(job, "failed", error="late")
        assert not a.requeue(job)
        assert a.heartbeat() == 0
        assert b.get(job)["progress"] == 0 and b.get(job)["status"] == "in_progress"
        b.set_progress(job, 40)
        a.set_progress_many({job: 60})
        assert b.get(job)["progress"] == 40
        b.set_progress_many({job: 45})
        assert b.statuses([job, "video_none"]) == {job: "in_progress"}
        assert b.get(job)["progress"] == 45
        time.sleep(1.5)                             # b's heartbeat thread holds it past 1 s
        assert a.claim(4) == [] and b.status_of(job) == "in_progress"
        assert b.finish(job, "completed", file=f"{job}.mp4")
        assert not b.finish(job, "completed", file="again.mp4")         # exactly once
        done = a.get(job)
        assert (done["status"], done["file"], done["progress"]) == ("completed", f"{job}.mp4",
                                                                    100)
        assert a.retried() == b.retried() == 1
        # a replica that stops hands its job back at once (no lease to wait for)
        second = b.add({"prompt": PROMPT}, None, 10)["id"]
        assert [j["id"] for j in b.claim(4)] == [second]
        assert not a.requeue(second) and b.requeue(second)
        assert [j["id"] for j in a.claim(4)] == [second]
    finally:
        a.close()
        b.close()


def test_a_job_interrupted_max_attempts_times_fails(url):
    dying = pg(url, lease=0.2, beat=False)
    try:
        job = dying.add({"prompt": PROMPT}, None, 10)["id"]
        for attempt in range(1, MAX_ATTEMPTS + 1):
            (got,) = dying.claim(4)            # the expired claim before is queued again
            assert got["id"] == job and got["attempts"] == attempt
            time.sleep(0.3)
        assert dying.claim(4) == []
        row = dying.get(job)
        assert row["status"] == "failed" and row["finished_at"] is not None
        assert f"{MAX_ATTEMPTS} times" in row["error"] and "lease" in row["error"]
        assert dying.counts() == {"queued": 0, "in_progress": 0, "completed": 0, "failed": 1,
                                  "cancelled": 0}
    finally:
        dying.close()


def test_cancel_from_another_replica(url):
    a, b = pg(url), pg(url)
    try:
        running, queued = (a.add({"prompt": f"p{i}"}, None, 10)["id"] for i in range(2))
        assert [j["id"] for j in a.claim(1)] == [running]
        assert not b.finish(running, "completed", file="x.mp4")      # not b's to complete
        assert b.finish(running, "cancelled") and b.finish(queued, "cancelled")
        assert not a.finish(running, "completed", file="x.mp4")      # a must not publish
        assert not b.finish(queued, "cancelled")                      # already
        assert [a.status_of(i) for i in (running, queued)] == ["cancelled"] * 2
        assert a.claim(4) == [] and b.claim(4) == []
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_both_stores_answer_alike(kind, tmp_path, postgres):  # noqa: F811
    """Batch keys (claim's batch_key), the model / files rule, the queue bound, list paging,
    retried(), heartbeat() and recover() as the SQLite store answers them."""
    db = tmp_path / "jobs.sqlite" if kind == "sqlite" else postgres.database()
    stores = [open_store(db, model=m, model_hash=h) for m, h in (("m", "h"), ("m", "h2"),
                                                                  ("other", "h"))]
    mine, changed, other = stores
    try:
        assert isinstance(mine, JobStore) == (kind == "sqlite")
        k1a = mine.add({"prompt": "1"}, "k1", 10)["id"]
        k2 = mine.add({"prompt": "2"}, "k2", 10)["id"]
        k1b = mine.add({"prompt": "3"}, "k1", 10)["id"]
        theirs = other.add({"prompt": "4"}, "k1", 10)["id"]
        with pytest.raises(QueueFull):
            changed.add({"prompt": "5"}, None, 4)
        assert mine.others() == 1 and changed.changed() == {"h": 3}
        # a running batch of k2 takes only k2's rows; the oldest key's otherwise
        assert [j["id"] for j in mine.claim(4, batch_key="k2")] == [k2]
        assert mine.claim(4, batch_key="k2") == []
        assert changed.claim(4) == []                    # submitted to other files
        assert [j["id"] for j in mine.claim(1)] == [k1a]
        assert [(j["id"], j["batch_size"]) for j in mine.claim(4)] == [(k1b, 1)]
        assert mine.claim(4) == [] and [j["id"] for j in other.claim(4)] == [theirs]
        assert mine.counts()["in_progress"] == 4
        assert mine.requeue(k1a) and [j["attempts"] for j in mine.claim(4)] == [2]
        assert mine.retried() == 1
        page, more = mine.list(2)
        assert [j["id"] for j in page] == [theirs, k1b] and more
        page, more = mine.list(2, after=k1b)
        assert [j["id"] for j in page] == [k2, k1a] and not more
        assert page[0]["request"] == {"prompt": "2"}
        mine.heartbeat()
        if kind == "postgres":
            mine.own()
            changed.own()                                # many replicas: nothing refused
            assert mine.recover() == ([], [])            # leases recover, not the start
            assert mine.counts()["in_progress"] == 4
    finally:
        for s in stores:
            s.close()


def test_bad_url_or_server_is_one_line(postgres, tmp_path, capsys):  # noqa: F811
    from ditax.cli import main

    port = free_port()                                   # nothing listens there
    fix = "start the server or fix the URL (postgresql://USER[:PASSWORD]@HOST:PORT/DB"
    cases = (
        (f"postgresql://ditax:s3cret@127.0.0.1:{port}/jobs", "cannot use this PostgreSQL job "
         "store (connection failed", fix),
        ("postgresql://ditax:s3cret@127.0.0.1:notaport/jobs", "not a PostgreSQL URL",
         "give postgresql://USER[:PASSWORD]@HOST:PORT/DB"),
        (f"postgresql://ditax:s3cret@127.0.0.1:{postgres.port}/no_such_db?password=s3cret",
         'database "no_such_db" does not exist', fix),
    )
    for bad, words, how in cases:
        with pytest.raises(ConfigError) as e:
            open_store(bad)
        line = str(e.value)
        assert "\n" not in line and words in line and "s3cret" not in line, line
        assert line.startswith("--db postgresql://ditax:***@127.0.0.1:") and how in line, line
        rc = main(["serve", "--model", "demo", "--db", bad, "--output-dir",
                   str(tmp_path / "out"), "--no-progress"])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and words in err[0] and "s3cret" not in err[0], err
    assert not (tmp_path / "out").exists()                # refused before anything is made
    for args, words in ((["--db", f"postgresql://ditax:s3cret@127.0.0.1:{port}/jobs"],
                         "give them all the same --output-dir"),
                        (["--db", "mysql://u@h/db"], "not at a mysql:// URL"),
                        (["--lease", "0"], "--lease=0.0 must be a finite number of seconds > 0"),
                        (["--lease", "nan"], "--lease=nan must be")):
        rc = main(["serve", "--model", "demo", *args, "--no-progress"])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and words in err[0] and "s3cret" not in err[0], err


def test_two_replicas_one_killed_every_job_completes_once(postgres, tmp_path_factory):  # noqa: F811
    """The issue's test: two ``ditax serve`` on one PostgreSQL store and one --output-dir,
    ``--lease 3``; the replica running a job is ``kill -9``-ed mid-denoise: its job runs again
    on the other, every accepted job completes once, each file is there once and downloads
    from the survivor as the same request run alone."""
    url = postgres.database()
    folder = tmp_path_factory.mktemp("serve_pg")
    out = folder / "videos"
    cache = shared_cache(tmp_path_factory)
    replicas = []
    for name in ("a", "b"):
        srv = Server(folder / name, "--lease", "3", "--max-batch", "1", "--drain", "0",
                     cache=cache)
        srv.db, srv.out = url, out              # the shared store and folder
        replicas.append(srv)
    starts = [threading.Thread(target=s.start) for s in replicas]
    for t in starts:
        t.start()
    for t in starts:
        t.join()
    try:
        assert all(s.proc is not None and s.proc.poll() is None for s in replicas), \
            [s.log.read_text()[-2000:] for s in replicas]
        a, b = replicas
        bodies = {a.submit(seed=s, **LONG)["id"]: dict(seed=s, **LONG) for s in range(2)}
        bodies |= {b.submit(seed=s, **SMALL)["id"]: dict(seed=s, **SMALL) for s in range(2, 4)}
        ids = list(bodies)
        by_pid = {s.proc.pid: s for s in replicas}
        # the replica running a job, mid-denoise (its owner in the store names its pid)
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline, rows(url)
            running = [r for r in rows(url).values()
                       if r["status"] == "in_progress" and 0 < r["progress"] <= 50
                       and bodies[r["id"]] == dict(seed=bodies[r["id"]]["seed"], **LONG)]
            if running:
                break
            time.sleep(0.01)
        victim = running[0]
        killed = by_pid[int(victim["owner"].split(":")[1])]
        killed.stop(signal.SIGKILL)
        after = rows(url)[victim["id"]]
        assert after["status"] == "in_progress" and after["owner"] == victim["owner"], \
            f"the job ended before the kill: {after}"
        survivor = b if killed is a else a
        done = {i: survivor.wait(i, timeout=90) for i in ids}
        assert [j["status"] for j in done.values()] == ["completed"] * len(ids), done
        final = rows(url)
        assert final[victim["id"]]["attempts"] == 2                      # ran again, once
        assert str(survivor.proc.pid) == final[victim["id"]]["owner"].split(":")[1]
        assert {r["status"] for r in final.values()} == {"completed"}
        files = sorted(p.name for p in out.iterdir())
        assert files == sorted(f"{i}.mp4" for i in ids), files         # one file a job
        assert survivor.call("GET", "/metrics")[0] == 200
        # the re-run job's video is the same request's run alone
        again = survivor.wait(survivor.submit(**bodies[victim["id"]])["id"], timeout=60)
        tmp = folder / "decode"
        tmp.mkdir()
        got = survivor.call("GET", f"/v1/videos/{victim['id']}/content")
        alone = survivor.call("GET", again["url"])
        assert got[0] == alone[0] == 200
        assert_same_video(mp4_frames(got[2], tmp), mp4_frames(alone[2], tmp))
        assert survivor.stop() == 0                  # SIGTERM: its store closes, exit 0
        assert "stopped; queued jobs stay in postgresql://" in survivor.log.read_text()
    finally:
        for s in replicas:
            s.stop()
    assert os.path.isdir(out)
