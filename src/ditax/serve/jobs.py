"""The durable job queue of ``ditax serve``: one SQLite table in WAL mode (stdlib ``sqlite3``).

A job is a row: its id (``video_`` + 32 hex digits, made here, never taken from a request),
the validated request (JSON), its batch key (jobs with equal keys may run as one batch), the
status (``queued`` → ``in_progress`` → ``completed`` | ``failed`` | ``cancelled``), progress
(0-100, denoising steps done), the error message, the output file name and timings. Every
change is one committed transaction, so a ``kill -9`` loses nothing that was accepted: at the
next start :meth:`JobStore.recover` puts the jobs that were running back in the queue (their
``attempts`` counted), and marks one failed with the reason once it has been interrupted
:data:`MAX_ATTEMPTS` times (a request that kills the server must not kill it forever).

A job records its model (the folder's resolved path), its output kind (video / image: what
the listings show it as) and the hash of that folder's files
(:func:`~ditax.serve.model_hash.folder_hash`); a server claims only the jobs of its model as
its files are now (:meth:`JobStore.queued` counts them apart), so weights replaced under the
same path never run a job submitted to the old ones.

:func:`ditax.serve.stores.open_store` opens the store ``--db`` names: this SQLite file (one server), or for a
``postgresql://`` URL the shared store of :mod:`ditax.serve.pgstore` (replicas that claim jobs
under leases, with the same methods).
"""

from __future__ import annotations

import json
import pathlib
import sqlite3
import threading
import time
import uuid

from ditax.errors import ConfigError

STATUSES = ("queued", "in_progress", "completed", "failed", "cancelled")
FINISHED = ("completed", "failed", "cancelled")
MAX_ATTEMPTS = 3         # runs of one job that a server stop may interrupt before it fails



def job_columns(real: str, key: str) -> str:
    """The columns of a job store's table, in order, as SQL (each store's ``CREATE TABLE``:
    this SQLite one and the PostgreSQL one of :mod:`ditax.serve.pgstore`), with the dialect's
    floating-point type ``real`` and auto-numbered primary key ``key``."""
    return f"""  seq {key},
  id TEXT UNIQUE NOT NULL,
  created_at {real} NOT NULL,
  status TEXT NOT NULL,
  progress INTEGER NOT NULL DEFAULT 0,
  request TEXT NOT NULL,
  batch_key TEXT NOT NULL,
  error TEXT,
  file TEXT,
  attempts INTEGER NOT NULL DEFAULT 0,
  batch_size INTEGER,
  compiles INTEGER,
  started_at {real},
  finished_at {real},
  seconds {real}"""


_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS jobs (
{job_columns("REAL", "INTEGER PRIMARY KEY AUTOINCREMENT")}
);
CREATE INDEX IF NOT EXISTS jobs_status ON jobs (status, seq);
"""


#: a job this server runs: its model's (as its files are now), or anyone's (no model / hash)
_MINE = "(model IS NULL OR model = ?) AND (model_hash IS NULL OR model_hash = ?)"

class QueueFull(Exception):
    """The queue holds ``max_queue`` unfinished jobs (the server answers 429)."""


PG_SCHEMES = ("postgresql://", "postgres://")


def is_pg_url(db) -> bool:
    """Whether ``--db`` names a PostgreSQL store (a ``postgresql://`` / ``postgres://`` URL)."""
    return str(db).lower().startswith(PG_SCHEMES)


def check_store_path(path) -> pathlib.Path | str:
    """``--db`` as given: a PostgreSQL URL (returned as the string, for
    :class:`~ditax.serve.pgstore.PgJobStore`) or a SQLite path (not a folder, not another
    scheme's URL); :class:`ConfigError` in one line naming the value otherwise."""
    text = str(path)
    if is_pg_url(text):
        return text
    if "://" in text:
        raise ConfigError(f"--db {text}: ditax serve keeps its jobs in a SQLite file or in "
                          f"PostgreSQL, not at a {text.split('://')[0]}:// URL; give a path "
                          f"(e.g. --db serve/jobs.sqlite) or postgresql://USER@HOST:PORT/DB")
    p = pathlib.Path(text).expanduser()
    if p.is_dir():
        raise ConfigError(f"--db {text} is a folder; give the job store's file, e.g. "
                          f"--db {p / 'jobs.sqlite'}")
    return p


class JobStore:
    """Jobs in the SQLite file ``path`` (created with its folder). One connection shared by
    the server's threads behind a lock: each method is one short transaction."""

    def __init__(self, path, model: str | None = None, model_hash: str | None = None):
        self.path = check_store_path(path)
        if isinstance(self.path, str):
            raise ConfigError(f"--db {path}: a PostgreSQL URL, not a SQLite file; open it with "
                              f"ditax.serve.stores.open_store (a PgJobStore)")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.model = model               # jobs added carry it; claim takes only its jobs
        self.model_hash = model_hash     # its files' (folder_hash): the same, for its jobs
        self._lock = threading.Lock()
        self._owner = None               # the store's lock file, while this server owns it
        try:
            self._db = sqlite3.connect(str(self.path), check_same_thread=False,
                                       isolation_level=None, timeout=30)
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")     # a committed job survives power loss
            self._db.executescript(_SCHEMA)
            columns = {r[1] for r in self._db.execute("PRAGMA table_info(jobs)")}
            # a store an earlier ditax serve made lacks the newer columns
            for column in ("model", "warnings", "model_hash", "kind"):
                if column not in columns:
                    try:
                        self._db.execute(f"ALTER TABLE jobs ADD COLUMN {column} TEXT")
                    except sqlite3.OperationalError as e:   # another process added it first
                        if "duplicate column" not in str(e):
                            raise
        except sqlite3.DatabaseError as e:      # OperationalError too: not a job store
            raise ConfigError(f"--db {self.path}: not a ditax job store ({e}); give a new "
                              f"file or a store an earlier ditax serve made") from None

    def own(self) -> None:
        """Make this process the store's one server (an exclusive lock on ``<db>.lock``, held
        until it exits); a second server on the same store is one :class:`ConfigError` line,
        before it loads or claims anything."""
        import fcntl
        import os

        f = open(self.path.with_name(self.path.name + ".lock"), "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            pid = f.read().strip() or "?"
            f.close()
            raise ConfigError(f"--db {self.path} is served by another ditax serve (pid {pid}); "
                              f"stop it, or give this server its own --db") from None
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        self._owner = f

    def queued(self) -> dict[str, int]:
        """Queued jobs: ``mine`` (this model's as its files are now, or anyone's: what
        :meth:`claim` takes) and ``others`` (another model's, or this one's before its files
        changed: left queued for them)."""
        with self._lock:
            row = self._db.execute(
                f"SELECT COUNT(*), COALESCE(SUM(CASE WHEN {_MINE} THEN 1 ELSE 0 END), 0) FROM "
                f"jobs WHERE status = 'queued'", (self.model or "", self.model_hash or "")
            ).fetchone()
        return {"mine": int(row[1]), "others": int(row[0] - row[1])}

    def others(self) -> int:
        """Queued jobs of another model (left queued for it)."""
        with self._lock:
            return self._db.execute(
                "SELECT COUNT(*) FROM jobs WHERE status = 'queued' AND model IS NOT NULL AND "
                "model != ?", (self.model or "",)).fetchone()[0]

    def changed(self) -> dict[str, int]:
        """Queued jobs of this model submitted when its files hashed otherwise (left queued for
        those files): ``{their hash: count}``."""
        with self._lock:
            rows = self._db.execute(
                "SELECT model_hash, COUNT(*) FROM jobs WHERE status = 'queued' AND model = ? "
                "AND model_hash IS NOT NULL AND model_hash != ? GROUP BY model_hash",
                (self.model or "", self.model_hash or "")).fetchall()
        return {r[0]: r[1] for r in rows}

    def _tx(self, fn):
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                out = fn(self._db)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
            return out

    def close(self) -> None:
        with self._lock:
            self._db.close()
        if self._owner is not None:
            self._owner.close()          # the lock goes with the file
            self._owner = None

    # --- writes
    def add(self, request: dict, batch_key: str | None, max_queue: int,
            kind: str | None = None) -> dict:
        """A new queued job of ``request``, kept with its model and output ``kind`` (``video``
        / ``image``: what the listings show it as, whichever model serves the store later);
        :class:`QueueFull` when ``max_queue`` unfinished jobs are waiting or running.
        ``batch_key`` None: the job runs alone (its id is its key)."""
        def add(db):
            n = db.execute("SELECT COUNT(*) FROM jobs WHERE status IN ('queued', "
                           "'in_progress')").fetchone()[0]
            if n >= max_queue:
                raise QueueFull(n)
            job_id = f"video_{uuid.uuid4().hex}"
            db.execute("INSERT INTO jobs (id, created_at, status, request, batch_key, model, "
                       "model_hash, kind) VALUES (?, ?, 'queued', ?, ?, ?, ?, ?)",
                       (job_id, time.time(), json.dumps(request), batch_key or job_id,
                        self.model, self.model_hash, kind))
            return job_id
        return self.get(self._tx(add))

    def claim(self, max_batch: int, batch_key: str | None = None) -> list[dict]:
        """Up to ``max_batch`` queued jobs of the oldest queued job's batch key (of
        ``batch_key``, when given: rows for a running batch of that key), oldest first, now
        ``in_progress`` (their ``attempts`` + 1); ``[]`` when none is queued. Only this
        model's jobs, submitted to its files as they are (another model's, or its files' before
        they changed, are left queued); a job without a model (or hash) is anyone's."""
        mine = f"status = 'queued' AND {_MINE}"
        ours = (self.model or "", self.model_hash or "")

        def claim(db):
            key = batch_key
            if key is None:
                first = db.execute(f"SELECT batch_key FROM jobs WHERE {mine} ORDER BY seq "
                                   f"LIMIT 1", ours).fetchone()
                if first is None:
                    return []
                key = first[0]
            ids = [r[0] for r in db.execute(
                f"SELECT id FROM jobs WHERE {mine} AND batch_key = ? ORDER BY seq LIMIT ?",
                (*ours, key, max_batch))]
            now = time.time()
            db.executemany("UPDATE jobs SET status = 'in_progress', progress = 0, attempts = "
                           "attempts + 1, started_at = ?, batch_size = ? WHERE id = ?",
                           [(now, len(ids), i) for i in ids])
            return ids
        return [self.get(i) for i in self._tx(claim)]

    def heartbeat(self) -> None:
        """Nothing: a SQLite store has one server, whose claims need no lease."""

    def set_progress(self, job_id: str, progress: int) -> None:
        """A running job's progress, never lower than it was (a late, lower value is no news;
        a run starts at 0 from :meth:`claim`)."""
        self._tx(lambda db: db.execute(
            "UPDATE jobs SET progress = MAX(progress, ?) WHERE id = ? AND status = "
            "'in_progress'", (int(progress), job_id)))

    def set_progress_many(self, progress: dict[str, int]) -> None:
        """:meth:`set_progress` of several running jobs in one transaction (a continuous
        batch's rows after a step)."""
        if progress:
            self._tx(lambda db: db.executemany(
                "UPDATE jobs SET progress = MAX(progress, ?) WHERE id = ? AND status = "
                "'in_progress'", [(int(p), i) for i, p in progress.items()]))

    def statuses(self, ids) -> dict[str, str]:
        """``{id: status}`` of the jobs ``ids`` (those that exist), in one read."""
        ids = list(ids)
        if not ids:
            return {}
        with self._lock:
            rows = self._db.execute(f"SELECT id, status FROM jobs WHERE id IN "
                                    f"({', '.join('?' * len(ids))})", ids).fetchall()
        return {r[0]: r[1] for r in rows}

    def finish(self, job_id: str, status: str, *, error: str | None = None,
               file: str | None = None, compiles: int | None = None,
               warnings: list[str] | None = None, batch_size: int | None = None) -> bool:
        """Mark a running (or queued, for ``cancelled``) job finished (``warnings``: what the
        run said about this job, e.g. a prompt cut to the text length; ``batch_size``: the
        most rows it ran beside in a continuous batch, None: as claimed); False when it was
        already finished (e.g. cancelled while its batch ran)."""
        assert status in FINISHED, status
        now = time.time()

        def finish(db):
            cur = db.execute(
                "UPDATE jobs SET status = ?, error = ?, file = ?, compiles = ?, finished_at = ?,"
                " seconds = ? - created_at, progress = CASE WHEN ? = 'completed' THEN 100 ELSE "
                "progress END, warnings = ?, batch_size = COALESCE(?, batch_size) WHERE id = ? "
                "AND status IN ('queued', 'in_progress')",
                (status, error, file, compiles, now, now, status,
                 json.dumps(warnings) if warnings else None, batch_size, job_id))
            return cur.rowcount == 1
        return self._tx(finish)

    def requeue(self, job_id: str) -> bool:
        """A running job back to the queue (the server stops; it runs again at the next
        start, or on the next server of the store); False when it was not running."""
        return self._tx(lambda db: db.execute(
            "UPDATE jobs SET status = 'queued', progress = 0 WHERE id = ? AND status = "
            "'in_progress'", (job_id,)).rowcount == 1)

    def forget_file(self, job_id: str) -> None:
        self._tx(lambda db: db.execute("UPDATE jobs SET file = NULL WHERE id = ?", (job_id,)))

    def recover(self) -> tuple[list[str], list[str]]:
        """At start: jobs left ``in_progress`` by a stopped server go back to the queue, or
        fail once interrupted :data:`MAX_ATTEMPTS` times; returns ``(requeued, failed)``."""
        def recover(db):
            rows = db.execute("SELECT id, attempts FROM jobs WHERE status = 'in_progress'")
            rows = [(r[0], r[1]) for r in rows]
            failed = [i for i, a in rows if a >= MAX_ATTEMPTS]
            requeued = [i for i, a in rows if a < MAX_ATTEMPTS]
            db.executemany("UPDATE jobs SET status = 'queued', progress = 0 WHERE id = ?",
                           [(i,) for i in requeued])
            now = time.time()
            db.executemany(
                "UPDATE jobs SET status = 'failed', finished_at = ?, error = ? WHERE id = ?",
                [(now, f"the server stopped while this job ran, {MAX_ATTEMPTS} times; it is "
                  f"not run again (resubmit it if the server was stopped for another reason)",
                  i) for i in failed])
            return requeued, failed
        return self._tx(recover)

    # --- reads
    def get(self, job_id: str) -> dict | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return None if row is None else job_of(row)

    def status_of(self, job_id: str) -> str | None:
        job = self.get(job_id)
        return None if job is None else job["status"]

    def list(self, limit: int = 20, after: str | None = None) -> tuple[list[dict], bool]:
        """Newest first, ``limit`` jobs created before job ``after`` (a cursor; None: from the
        newest); returns ``(jobs, has_more)``."""
        with self._lock:
            seq = None
            if after is not None:
                row = self._db.execute("SELECT seq FROM jobs WHERE id = ?", (after,)).fetchone()
                seq = -1 if row is None else row[0]
            q = "SELECT * FROM jobs" + ("" if seq is None else " WHERE seq < ?")
            rows = self._db.execute(q + " ORDER BY seq DESC LIMIT ?",
                                    (() if seq is None else (seq,)) + (limit + 1,)).fetchall()
        return [job_of(r) for r in rows[:limit]], len(rows) > limit

    def waiting_since(self, batch_key: str) -> float | None:
        """When the oldest queued job of this model with another batch key than ``batch_key``
        was submitted (None: none waits) — the continuous batch's max-wait policy."""
        mine = f"status = 'queued' AND {_MINE} AND batch_key != ?"
        with self._lock:
            row = self._db.execute(f"SELECT MIN(created_at) FROM jobs WHERE {mine}",
                                   (self.model or "", self.model_hash or "",
                                    batch_key)).fetchone()
        return None if row is None else row[0]

    def counts(self) -> dict[str, int]:
        """Jobs per status (every status present, 0 where none)."""
        with self._lock:
            rows = self._db.execute("SELECT status, COUNT(*) FROM jobs GROUP BY status")
            got = dict(rows.fetchall())
        return {s: int(got.get(s, 0)) for s in STATUSES}

    def retried(self) -> int:
        """Jobs claimed more than once (run again after a stop that interrupted them)."""
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM jobs WHERE attempts > 1").fetchone()[0]


def job_of(row) -> dict:
    """A job as the stores return it: its row (SQLite's or PostgreSQL's) as a dict, the request
    read back from its JSON."""
    job = dict(row)
    job["request"] = json.loads(job["request"])
    return job


__all__ = ["FINISHED", "JobStore", "MAX_ATTEMPTS", "QueueFull", "STATUSES", "check_store_path",
           "is_pg_url", "job_columns", "job_of"]
