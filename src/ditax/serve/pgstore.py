"""The shared job queue of ``ditax serve`` replicas: one PostgreSQL table (psycopg 3).

The same jobs, methods and answers as the SQLite :class:`~ditax.serve.jobs.JobStore`, for
several servers at once (``--db postgresql://USER@HOST:PORT/DB``). A replica claims jobs
under a lease: :meth:`PgJobStore.claim` takes queued rows with ``SELECT ... FOR UPDATE SKIP
LOCKED`` (two replicas never take one row), marks them ``in_progress`` with ``owner`` (this
replica's id, ``host:pid:random``) and ``lease_until`` (now + ``lease`` seconds, the database
server's clock, so replicas on other hosts agree). A thread of the store renews the leases of
the jobs its replica runs every ``lease / 3`` seconds (:meth:`PgJobStore.heartbeat`); when a
replica dies (``kill -9``, a lost host) its leases run out and the next claim of any replica
puts those jobs back in the queue (``attempts`` counted), or fails one that has been
interrupted :data:`~ditax.serve.jobs.MAX_ATTEMPTS` times. So there is nothing to recover at
start, and many servers may share the store (:meth:`PgJobStore.own` is nothing).

A replica acts on a job only while it holds it: :meth:`~PgJobStore.finish` (completed /
failed), :meth:`~PgJobStore.set_progress` and :meth:`~PgJobStore.requeue` change a row only if
it is ``in_progress`` and this replica's; a replica whose lease ran out and whose job another
took gets False from ``finish`` and must not publish its output. A job is completed once.
Cancelling (``finish(id, "cancelled")``, the API's DELETE) works from any replica on a queued
or running job of any owner.

Every method is one short transaction on a connection of a small pool (the FastAPI threads,
the worker and the heartbeat use the store at once). Times are the database server's epoch
seconds. The URL's checks and the connection pool: :mod:`ditax.serve.pgpool`.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
import time
import uuid

from ditax.errors import ConfigError
from ditax.serve.jobs import (FINISHED, MAX_ATTEMPTS, STATUSES, QueueFull, job_columns,
                              job_of)
from ditax.serve.pgpool import USAGE, Pool, check_url, mask_url, url_password

log = logging.getLogger(__name__)

TABLE = "ditax_jobs"
#: the store's advisory lock keys: the schema's creation, and the queue-size check of add()
_SCHEMA_LOCK, _ADD_LOCK = 0x64697461_78000001, 0x64697461_78000002
#: the database server's clock, epoch seconds (clock_timestamp: not the transaction's start)
_NOW = "EXTRACT(EPOCH FROM clock_timestamp())::double precision"
#: connections a store keeps open at most (the server's threads wait for one beyond)
POOL_SIZE = 8
#: seconds to wait for the database server when a connection opens (unless the URL says)
CONNECT_TIMEOUT = 5

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
{job_columns("DOUBLE PRECISION", "BIGSERIAL PRIMARY KEY")},
  model TEXT,
  warnings TEXT,
  model_hash TEXT,
  owner TEXT,
  lease_until DOUBLE PRECISION
);
ALTER TABLE {TABLE} ADD COLUMN IF NOT EXISTS kind TEXT;
CREATE INDEX IF NOT EXISTS {TABLE}_status ON {TABLE} (status, seq);
"""

#: this model's jobs, as the SQLite store's claim reads them (parameters: model, hash)
_MINE = ("status = 'queued' AND (model IS NULL OR model = %s) AND (model_hash IS NULL OR "
         "model_hash = %s)")


class PgJobStore:
    """Jobs in table ``ditax_jobs`` of the PostgreSQL database at ``url`` (created if
    missing), shared by every replica given that URL; ``lease``: the seconds a claim holds a
    job without a heartbeat. Connects at once: a bad URL or a server that does not answer is
    one :class:`ConfigError` line naming the URL (its password masked), before a model loads.
    The heartbeat thread starts here and ends with :meth:`close` (``beat`` False: no thread,
    the caller renews the leases with :meth:`heartbeat`)."""

    def __init__(self, url: str, model: str | None = None, model_hash: str | None = None,
                 lease: float = 30.0, beat: bool = True):
        if not 0 < lease < float("inf"):
            raise ConfigError(f"--lease {lease}: a claim's lease must be a finite number of "
                              f"seconds > 0, e.g. --lease 30")
        self.url = str(url)
        self.path = mask_url(self.url)     # what the server prints as its store
        self.model = model
        self.model_hash = model_hash
        self.lease = float(lease)
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        check_url(self.url)
        try:
            import psycopg
        except ImportError as e:
            raise ConfigError(f"--db {self.path}: a PostgreSQL store needs psycopg 3 ({e}); "
                              f"install it with pip install 'ditax[serve]'") from None
        self._psycopg = psycopg
        self._pool = Pool(self._connect, POOL_SIZE)
        try:
            with self._pool.conn() as conn, conn.transaction(), conn.cursor() as cur:
                cur.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                cur.execute(_SCHEMA)
        except psycopg.Error as e:
            self._pool.close()
            reason = " ".join(str(e).split())
            secret = url_password(self.url)
            if secret:
                reason = reason.replace(secret, "***")
            raise ConfigError(f"--db {self.path}: cannot use this PostgreSQL job store "
                              f"({reason}); start the server or fix the URL ({USAGE}; the "
                              f"user needs CREATE on the database, or an existing {TABLE} "
                              f"table)") from None
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._beats, name="ditax-store-heartbeat",
                                      daemon=True)
        if beat:
            self._beat.start()

    def _connect(self):
        from psycopg.rows import dict_row

        extra = {} if "connect_timeout" in self.url else {"connect_timeout": CONNECT_TIMEOUT}
        return self._psycopg.connect(self.url, autocommit=True, row_factory=dict_row,
                                     application_name="ditax serve", **extra)

    def _tx(self, fn):
        """``fn(cursor)`` in one transaction on a pooled connection."""
        with self._pool.conn() as conn, conn.transaction(), conn.cursor() as cur:
            return fn(cur)

    def _one(self, query: str, params=()):
        return self._tx(lambda cur: cur.execute(query, params).fetchone())

    def _beats(self) -> None:
        said = False
        while not self._stop.wait(self.lease / 3):
            try:
                self.heartbeat()
                said = False
            except Exception as e:  # noqa: BLE001 — the database may come back; say it once
                if not said:
                    log.warning("job store %s: cannot renew the leases of this replica's "
                                "jobs (%s); they go to another replica if this lasts %g s",
                                self.path, " ".join(str(e).split()), self.lease)
                    said = True

    def own(self) -> None:
        """Nothing: any number of replicas may serve a PostgreSQL store (leases share it)."""

    def recover(self) -> tuple[list[str], list[str]]:
        """Nothing to recover at start: a stopped replica's jobs go back to the queue when
        their leases run out (at a claim). Returns ``([], [])``."""
        return [], []

    def close(self) -> None:
        self._stop.set()
        if self._beat.is_alive() and self._beat is not threading.current_thread():
            self._beat.join(5)
        self._pool.close()

    # --- leases
    def heartbeat(self) -> int:
        """Renew the lease of every job this replica runs (now + ``lease`` seconds); the
        number renewed."""
        return self._tx(lambda cur: cur.execute(
            f"UPDATE {TABLE} SET lease_until = {_NOW} + %s WHERE owner = %s AND status = "
            f"'in_progress'", (self.lease, self.owner)).rowcount)

    def _expire(self, cur) -> None:
        """Jobs whose replica's lease ran out: back to the queue, or failed once interrupted
        :data:`MAX_ATTEMPTS` times."""
        expired = (f"SELECT id FROM {TABLE} WHERE status = 'in_progress' AND lease_until < "
                   f"{_NOW} FOR UPDATE SKIP LOCKED")
        cur.execute(
            f"UPDATE {TABLE} SET status = 'failed', finished_at = {_NOW}, seconds = {_NOW} - "
            f"created_at, owner = NULL, lease_until = NULL, error = %s WHERE id IN ({expired}) "
            f"AND attempts >= %s",
            (f"the replica that ran this job stopped (its lease of the job ran out), "
             f"{MAX_ATTEMPTS} times; it is not run again (resubmit it if the replicas stopped "
             f"for another reason)", MAX_ATTEMPTS))
        cur.execute(f"UPDATE {TABLE} SET status = 'queued', progress = 0, owner = NULL, "
                    f"lease_until = NULL WHERE id IN ({expired})")

    # --- writes
    def add(self, request: dict, batch_key: str | None, max_queue: int,
            kind: str | None = None) -> dict:
        """A new queued job of ``request``, kept with its model and output ``kind``;
        :class:`QueueFull` when ``max_queue`` unfinished jobs (of all replicas) are waiting or
        running. ``batch_key`` None: the job runs alone (its id is its key)."""
        def add(cur):
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_ADD_LOCK,))   # count + insert
            n = cur.execute(f"SELECT COUNT(*) AS n FROM {TABLE} WHERE status IN ('queued', "
                            f"'in_progress')").fetchone()["n"]
            if n >= max_queue:
                raise QueueFull(n)
            job_id = f"video_{uuid.uuid4().hex}"
            return cur.execute(
                f"INSERT INTO {TABLE} (id, created_at, status, request, batch_key, model, "
                f"model_hash, kind) VALUES (%s, {_NOW}, 'queued', %s, %s, %s, %s, %s) "
                f"RETURNING *", (job_id, json.dumps(request), batch_key or job_id, self.model,
                                 self.model_hash, kind)).fetchone()
        return job_of(self._tx(add))

    def claim(self, max_batch: int, batch_key: str | None = None) -> list[dict]:
        """Up to ``max_batch`` queued jobs of the oldest queued job's batch key (of
        ``batch_key``, when given: rows for a running batch of that key), oldest first, now
        ``in_progress`` under this replica's lease (their ``attempts`` + 1); ``[]`` when none
        is queued. Jobs of a replica whose lease ran out are queued again first (or failed,
        :meth:`_expire`). Only this model's jobs, submitted to its files as they are (another
        model's, or its files' before they changed, are left queued); a job without a model
        (or hash) is anyone's. Rows another replica is claiming are skipped, never waited
        for."""
        ours = (self.model or "", self.model_hash or "")

        def claim(cur):
            self._expire(cur)
            key = batch_key
            if key is None:
                first = cur.execute(f"SELECT batch_key FROM {TABLE} WHERE {_MINE} ORDER BY seq "
                                    f"LIMIT 1 FOR UPDATE SKIP LOCKED", ours).fetchone()
                if first is None:
                    return []
                key = first["batch_key"]
            ids = [r["id"] for r in cur.execute(
                f"SELECT id FROM {TABLE} WHERE {_MINE} AND batch_key = %s ORDER BY seq LIMIT %s "
                f"FOR UPDATE SKIP LOCKED", (*ours, key, max_batch)).fetchall()]
            if not ids:
                return []
            return cur.execute(
                f"UPDATE {TABLE} SET status = 'in_progress', progress = 0, attempts = attempts "
                f"+ 1, started_at = {_NOW}, batch_size = %s, owner = %s, lease_until = {_NOW} + "
                f"%s WHERE id = ANY(%s) RETURNING *",
                (len(ids), self.owner, self.lease, ids)).fetchall()
        return [job_of(r) for r in sorted(self._tx(claim), key=lambda r: r["seq"])]

    def set_progress(self, job_id: str, progress: int) -> None:
        """A job's progress while this replica runs it, never lower than it was (as the
        SQLite store's)."""
        self._tx(lambda cur: cur.execute(
            f"UPDATE {TABLE} SET progress = GREATEST(progress, %s) WHERE id = %s AND status = "
            f"'in_progress' AND owner = %s", (int(progress), job_id, self.owner)))

    def set_progress_many(self, progress: dict[str, int]) -> None:
        """:meth:`set_progress` of several jobs this replica runs, in one transaction (a
        continuous batch's rows after a step)."""
        if progress:
            self._tx(lambda cur: cur.executemany(
                f"UPDATE {TABLE} SET progress = GREATEST(progress, %s) WHERE id = %s AND "
                f"status = 'in_progress' AND owner = %s",
                [(int(v), i, self.owner) for i, v in progress.items()]))

    def finish(self, job_id: str, status: str, *, error: str | None = None,
               file: str | None = None, compiles: int | None = None,
               warnings: list[str] | None = None, batch_size: int | None = None) -> bool:
        """Mark a job this replica runs finished (``completed`` / ``failed``; ``warnings``:
        what the run said about it; ``batch_size``: the most rows it ran beside in a continuous
        batch, None: as claimed), or a queued or running job of any replica ``cancelled``;
        False when nothing changed: the job was already finished (e.g. cancelled while its
        batch ran) or, for completed / failed, it is no longer this replica's (its lease ran
        out and another replica took it: the caller must not publish its output)."""
        assert status in FINISHED, status
        mine = "" if status == "cancelled" else "AND status = 'in_progress' AND owner = %s"
        return self._tx(lambda cur: cur.execute(
            f"UPDATE {TABLE} SET status = %s, error = %s, file = %s, compiles = %s, "
            f"finished_at = {_NOW}, seconds = {_NOW} - created_at, progress = CASE WHEN %s = "
            f"'completed' THEN 100 ELSE progress END, warnings = %s, batch_size = "
            f"COALESCE(%s, batch_size), lease_until = NULL WHERE id = %s AND status IN "
            f"('queued', 'in_progress') {mine}",
            (status, error, file, compiles, status,
             json.dumps(warnings) if warnings else None, batch_size, job_id)
            + (() if status == "cancelled" else (self.owner,))).rowcount == 1)

    def requeue(self, job_id: str) -> bool:
        """A job this replica runs back to the queue (the replica stops; another, or the next,
        runs it); False when it was not running here."""
        return self._tx(lambda cur: cur.execute(
            f"UPDATE {TABLE} SET status = 'queued', progress = 0, owner = NULL, lease_until = "
            f"NULL WHERE id = %s AND status = 'in_progress' AND owner = %s",
            (job_id, self.owner)).rowcount == 1)

    def forget_file(self, job_id: str) -> None:
        self._tx(lambda cur: cur.execute(f"UPDATE {TABLE} SET file = NULL WHERE id = %s",
                                         (job_id,)))

    # --- reads
    def get(self, job_id: str) -> dict | None:
        row = self._one(f"SELECT * FROM {TABLE} WHERE id = %s", (job_id,))
        return None if row is None else job_of(row)

    def status_of(self, job_id: str) -> str | None:
        job = self.get(job_id)
        return None if job is None else job["status"]

    def statuses(self, ids) -> dict[str, str]:
        """``{id: status}`` of the jobs ``ids`` (those that exist), in one read."""
        ids = list(ids)
        if not ids:
            return {}
        rows = self._tx(lambda cur: cur.execute(
            f"SELECT id, status FROM {TABLE} WHERE id = ANY(%s)", (ids,)).fetchall())
        return {r["id"]: r["status"] for r in rows}

    def list(self, limit: int = 20, after: str | None = None) -> tuple[list[dict], bool]:
        """Newest first, ``limit`` jobs created before job ``after`` (a cursor; None: from the
        newest); returns ``(jobs, has_more)``."""
        def page(cur):
            seq = None
            if after is not None:
                row = cur.execute(f"SELECT seq FROM {TABLE} WHERE id = %s", (after,)).fetchone()
                seq = -1 if row is None else row["seq"]
            q = f"SELECT * FROM {TABLE}" + ("" if seq is None else " WHERE seq < %s")
            return cur.execute(q + " ORDER BY seq DESC LIMIT %s",
                               (() if seq is None else (seq,)) + (limit + 1,)).fetchall()
        rows = self._tx(page)
        return [job_of(r) for r in rows[:limit]], len(rows) > limit

    def counts(self) -> dict[str, int]:
        """Jobs per status (every status present, 0 where none), of all replicas."""
        rows = self._tx(lambda cur: cur.execute(
            f"SELECT status, COUNT(*) AS n FROM {TABLE} GROUP BY status").fetchall())
        got = {r["status"]: r["n"] for r in rows}
        return {s: int(got.get(s, 0)) for s in STATUSES}

    def waiting_since(self, batch_key: str) -> float | None:
        """When (this machine's ``time.time()``) the oldest queued job of this model with
        another batch key than ``batch_key`` was submitted (None: none waits) — the continuous
        batch's max-wait policy. Its age is measured on the database server's clock, so
        replicas whose clocks differ from it agree."""
        row = self._one(
            f"SELECT {_NOW} - MIN(created_at) AS age FROM {TABLE} WHERE {_MINE} AND batch_key "
            f"!= %s", (self.model or "", self.model_hash or "", batch_key))
        return None if row is None or row["age"] is None else time.time() - row["age"]

    def retried(self) -> int:
        """Jobs claimed more than once (run again after a replica stopped or its lease ran
        out)."""
        return int(self._one(f"SELECT COUNT(*) AS n FROM {TABLE} WHERE attempts > 1")["n"])

    def queued(self) -> dict[str, int]:
        """Queued jobs: ``mine`` (what :meth:`claim` takes) and ``others`` (another model's,
        or this one's before its files changed)."""
        row = self._one(f"SELECT COUNT(*) AS n, COALESCE(SUM(CASE WHEN {_MINE} THEN 1 ELSE 0 "
                        f"END), 0) AS mine FROM {TABLE} WHERE status = 'queued'",
                        (self.model or "", self.model_hash or ""))
        return {"mine": int(row["mine"]), "others": int(row["n"] - row["mine"])}

    def others(self) -> int:
        """Queued jobs of another model (left queued for it)."""
        return int(self._one(
            f"SELECT COUNT(*) AS n FROM {TABLE} WHERE status = 'queued' AND model IS NOT NULL "
            f"AND model != %s", (self.model or "",))["n"])

    def changed(self) -> dict[str, int]:
        """Queued jobs of this model submitted when its files hashed otherwise (left queued for
        those files): ``{their hash: count}``."""
        rows = self._tx(lambda cur: cur.execute(
            f"SELECT model_hash, COUNT(*) AS n FROM {TABLE} WHERE status = 'queued' AND model "
            f"= %s AND model_hash IS NOT NULL AND model_hash != %s GROUP BY model_hash",
            (self.model or "", self.model_hash or "")).fetchall())
        return {r["model_hash"]: int(r["n"]) for r in rows}


__all__ = ["PgJobStore"]
