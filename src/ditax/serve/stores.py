"""The job store ``ditax serve --db`` names: :class:`~ditax.serve.jobs.JobStore` (a SQLite
file, one server) or :class:`~ditax.serve.pgstore.PgJobStore` (PostgreSQL, shared by
replicas)."""

from __future__ import annotations

from ditax.serve.jobs import JobStore, check_store_path
from ditax.serve.pgstore import PgJobStore


def open_store(db, model: str | None = None, model_hash: str | None = None,
               lease: float = 30.0):
    """The job store ``--db`` names: :class:`JobStore` (SQLite, one server) for a path,
    :class:`~ditax.serve.pgstore.PgJobStore` (PostgreSQL, shared by replicas whose claims hold
    a ``lease`` of that many seconds) for a ``postgresql://`` URL."""
    db = check_store_path(db)
    if isinstance(db, str):
        return PgJobStore(db, model=model, model_hash=model_hash, lease=lease)
    return JobStore(db, model=model, model_hash=model_hash)


__all__ = ["open_store"]
