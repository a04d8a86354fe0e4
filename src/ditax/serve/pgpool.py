"""Connections to a PostgreSQL job store (:mod:`ditax.serve.pgstore`): its URL checked before
connecting and shown with the password masked (:func:`check_url`, :func:`mask_url`), and a small
pool of connections shared by the server's threads (:class:`Pool`).
"""

from __future__ import annotations

import contextlib
import threading
import time
import urllib.parse

from ditax.errors import ConfigError

#: seconds a pooled connection may sit idle before it is checked again before use
PING_AFTER = 5.0
#: what a PostgreSQL store's ``--db`` looks like (messages)
USAGE = "postgresql://USER[:PASSWORD]@HOST:PORT/DB"


def mask_url(url: str) -> str:
    """``url`` with its password (in the address or a ``password=`` parameter) as ``***``."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return url
    netloc = parts.netloc
    if "@" in netloc:
        user, host = netloc.rsplit("@", 1)
        if ":" in user:
            netloc = f"{user.split(':', 1)[0]}:***@{host}"
    query = "&".join("password=***" if q.partition("=")[0] == "password" else q
                     for q in parts.query.split("&") if q)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc, query=query))


def url_password(url: str) -> str | None:
    with contextlib.suppress(ValueError):
        parts = urllib.parse.urlsplit(url)
        if parts.password:
            return urllib.parse.unquote(parts.password)
        found = urllib.parse.parse_qs(parts.query).get("password")
        if found:
            return found[0]
    return None


def check_url(url: str) -> None:
    """The parts of ``url`` ditax can check before connecting (one :class:`ConfigError` line
    naming the masked URL otherwise): a host or socket, a port that is a number."""
    shown = mask_url(url)
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port                                     # noqa: B018 — raises if not a number
    except ValueError as e:
        raise ConfigError(f"--db {shown}: not a PostgreSQL URL ({e}); give {USAGE}, e.g. "
                          f"postgresql://ditax@127.0.0.1:5432/ditax") from None


def _alive(conn) -> bool:
    try:
        conn.execute("SELECT 1")
        return True
    except Exception:  # noqa: BLE001 — any failure: the connection is replaced
        return False


class Pool:
    """Up to ``size`` open connections made by ``connect``; :meth:`conn` lends one (waiting
    while all are lent) and takes it back, dropping one that broke. A connection idle for
    :data:`PING_AFTER` seconds is checked (``SELECT 1``) before it is lent and replaced if the
    server dropped it (a restart, an idle timeout): a statement is never sent twice."""

    def __init__(self, connect, size: int):
        self._connect, self._size = connect, size
        self._idle: list = []            # (connection, monotonic time it came back)
        self._open = 0
        self._closed = False
        self._cv = threading.Condition()

    @contextlib.contextmanager
    def conn(self):
        with self._cv:
            while not self._idle and self._open >= self._size and not self._closed:
                self._cv.wait()
            if self._closed:
                raise RuntimeError("the job store is closed")
            c, since = self._idle.pop() if self._idle else (None, 0.0)
            if c is None:
                self._open += 1
        try:
            if c is not None and time.monotonic() - since > PING_AFTER and not _alive(c):
                c.close()
                c = None
            if c is None:
                c = self._connect()
            yield c
        except BaseException:
            if c is not None and (c.closed or c.broken):
                c.close()
                c = None
            raise
        finally:
            with self._cv:
                if c is None or c.closed or c.broken or self._closed:
                    if c is not None:
                        c.close()
                    self._open -= 1
                else:
                    self._idle.append((c, time.monotonic()))
                self._cv.notify()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            for c, _ in self._idle:
                c.close()
            self._open -= len(self._idle)
            self._idle.clear()
            self._cv.notify_all()


__all__ = ["PING_AFTER", "Pool", "USAGE", "check_url", "mask_url", "url_password"]
