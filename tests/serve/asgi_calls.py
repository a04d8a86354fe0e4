"""The ``ditax serve`` app called in this process, without a socket or a model: a
:class:`~ditax.serve.app.ServeState` over a SQLite store and a worker that never starts, and
one request sent through the ASGI interface (no HTTP client library needed). For the routes
that read the store and answer from it (listings, health, errors)."""

from __future__ import annotations

import asyncio
import json
import urllib.parse


class IdleWorker:
    """What the routes ask of a worker, for one that never runs a job."""

    started = False
    stopping = False
    running: dict = {}

    def __init__(self):
        import threading

        from ditax.serve.metrics import Metrics

        self.wake = threading.Event()
        self.metrics = Metrics()

    def is_alive(self) -> bool:
        return False

    def cancel(self, job_id: str) -> None:
        pass


def app_state(store, model: str = "demo", makes: str = "video"):
    """A :class:`ServeState` of ``store`` serving ``model`` (``makes``: its output kind)."""
    import pathlib

    from ditax.serve.app import ServeState

    return ServeState(model=model, overrides=[], store=store,
                      worker=IdleWorker(), output_dir=pathlib.Path(str(store.path)).parent,
                      makes=makes)


def call(app, method: str, target: str, body: bytes = b"") -> tuple[int, dict]:
    """``(status, JSON body)`` of one request to the ASGI ``app``."""
    status, _, raw = call_raw(app, method, target, body)
    return status, json.loads(raw or b"null")


def call_raw(app, method: str, target: str, body: bytes = b"") -> tuple[int, dict, bytes]:
    """``(status, headers, body bytes)`` of one request to the ASGI ``app``."""
    url = urllib.parse.urlsplit(target)
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": method, "scheme": "http", "path": url.path,
             "raw_path": url.path.encode(), "query_string": url.query.encode(),
             "root_path": "", "headers": [(b"host", b"test"),
                                          (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 1), "server": ("test", 80)}
    sent = [{"type": "http.request", "body": body, "more_body": False}]
    out = {"status": None, "headers": {}, "body": b""}

    async def receive():
        return sent.pop(0) if sent else {"type": "http.disconnect"}

    async def send(message):
        if message["type"] == "http.response.start":
            out["status"] = message["status"]
            out["headers"] = {k.decode(): v.decode() for k, v in message.get("headers", ())}
        elif message["type"] == "http.response.body":
            out["body"] += message.get("body", b"")

    asyncio.run(app(scope, receive, send))
    return out["status"], out["headers"], out["body"]
