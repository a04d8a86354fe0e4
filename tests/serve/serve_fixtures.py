"""A real ``ditax serve`` process on 127.0.0.1 (a free port) — or on a Unix domain socket
(``uds=``: machines without TCP) — for the serve tests and ``benchmarks/serve.py``, and a small
HTTP client (stdlib ``urllib`` / ``http.client``; no client library the server does not itself
need).

The server runs the shipped demo model at a tiny size (:data:`SMALL`: 32x32, 5 frames, 2
steps) in a subprocess that inherits the suite's environment (CPU, optimisations off); each
test module starts its own and shares it between its tests.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import jax

SMALL = {"size": "32x32", "num_frames": 5, "num_inference_steps": 2}
# long enough to be stopped mid-denoise or watched on the page; the faults and browser servers
# (--lora-dir, --max-batch 1) run the same programs, so one module reads what the other compiled
LONG = {**SMALL, "num_inference_steps": 24}
PROMPT = "a red circle moves right"


def write_lora(path):
    """A random PEFT-format LoRA for the demo model's self-attention q / v (D = 320)."""
    from lora_reference import demo_lora, write_peft

    return write_peft(path, demo_lora())


def shared_cache(tmp_path_factory) -> pathlib.Path:
    """One persistent compile cache for the serve modules of this run (the servers and the
    ``ditax generate`` they are compared with read each other's programs)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):      # the workers' folders share a parent
        base = base.parent
    return base / "serve_compile_cache"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def short_socket_path() -> pathlib.Path:
    """A fresh Unix socket path short enough for ``sockaddr_un`` (pytest's folders may not
    be)."""
    return pathlib.Path(tempfile.mkdtemp(prefix="ditax_uds_")) / "serve.sock"


class Server:
    """``ditax serve --model MODEL`` (the demo model unless told) with ``args``, its jobs in
    ``db``; :meth:`start` waits for ``/health``. ``uds``: serve on a Unix domain socket
    (a path, or True for a fresh short one) instead of a free TCP port; :attr:`url` is then
    ``unix:PATH``, which :func:`request` understands."""

    def __init__(self, folder: pathlib.Path, *args: str, db=None, cache=None, model="demo",
                 env=None, uds=None):
        self.model = str(model)
        self.folder = pathlib.Path(folder)
        self.db = pathlib.Path(db or self.folder / "jobs.sqlite")
        self.out = self.folder / "videos"
        self.cache = cache
        self.args = list(args)
        self.env = dict(env or {})      # on top of the suite's environment
        self.uds = (short_socket_path() if uds is True else
                    pathlib.Path(uds) if uds else None)
        self.made_uds_dir = uds is True         # stop() removes the folder it made
        self.port = None
        self.url = self._address()
        self.proc: subprocess.Popen | None = None
        self.log = self.folder / "server.log"

    def _address(self) -> str:
        """``unix:PATH``, or a fresh free port's URL (no TCP socket is opened in uds mode:
        machines without TCP)."""
        if self.uds is not None:
            self.uds.parent.mkdir(parents=True, exist_ok=True)     # again after a stop()
            return f"unix:{self.uds}"
        self.port = free_port()
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 90.0) -> "Server":
        self.url = self._address()
        where = (["--uds", str(self.uds)] if self.uds is not None else
                 ["--port", str(self.port)])
        cmd = [sys.executable, "-m", "ditax.cli", "serve", "--model", self.model, *where,
               "--db", str(self.db), "--output-dir", str(self.out), "--no-progress",
               *self.args]
        if self.cache is not None:
            cmd.append(f"compile_cache={self.cache}")
        self.folder.mkdir(parents=True, exist_ok=True)
        log = open(self.log, "ab")
        # the suite's matmul precision (tests/conftest.py sets it in jax's config), so that
        # the server's programs are the test process's: one compile cache serves both
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        if jax.config.jax_default_matmul_precision is not None:
            env["JAX_DEFAULT_MATMUL_PRECISION"] = str(jax.config.jax_default_matmul_precision)
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ditax serve exited {self.proc.returncode}:\n"
                                   f"{self.log.read_text()[-3000:]}")
            with contextlib.suppress(OSError):
                if request(self.url, "GET", "/health")[0] == 200:
                    return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"ditax serve did not answer in {timeout}s:\n{self.log.read_text()}")

    def stop(self, sig=signal.SIGTERM, timeout: float = 60.0) -> int | None:
        """Send ``sig`` and wait; the exit status (None if it was not running)."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()
        finally:
            if self.made_uds_dir and self.proc.poll() is not None:
                with contextlib.suppress(OSError):   # empty once the server removed its file
                    self.uds.parent.rmdir()

    def call(self, method: str, path: str, body=None, headers=None):
        return request(self.url, method, path, body, headers)

    def submit(self, headers=None, **body):
        status, _, data = self.call("POST", "/v1/videos", {"prompt": PROMPT, **SMALL, **body},
                                    headers)
        assert status == 200, data
        return data

    def wait(self, job_id: str, statuses=("completed", "failed", "cancelled"),
             timeout: float = 120.0, headers=None, poll: float = 0.05) -> dict:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            status, _, job = self.call("GET", f"/v1/videos/{job_id}", headers=headers)
            assert status == 200, job
            if job["status"] in statuses:
                return job
            time.sleep(poll)
        raise AssertionError(f"{job_id} still {job['status']} after {timeout}s:\n"
                             f"{self.log.read_text()[-3000:]}")


class UnixHTTPConnection(http.client.HTTPConnection):
    """``http.client`` over a Unix domain socket (the standard library has no such class)."""

    def __init__(self, socket_path, timeout: float = 60.0):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = str(socket_path)

    def connect(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def request(url: str, method: str, path: str, body=None, headers=None):
    """``(status, headers, JSON or bytes)`` of one HTTP call to ``url`` (``http://HOST:PORT``
    or ``unix:SOCKET_PATH``); ``body``: a dict (sent as JSON), bytes, or None."""
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    head = {"Content-Type": "application/json", **(headers or {})}
    if url.startswith("unix:"):
        conn = UnixHTTPConnection(url[len("unix:"):])
        try:
            conn.request(method, path, body=data, headers=head)
            r = conn.getresponse()
            status, head, raw = r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            conn.close()
    else:
        req = urllib.request.Request(url + path, data=data, method=method, headers=head)
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                status, head, raw = r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as e:
            status, head, raw = e.code, dict(e.headers), e.read()
    kind = head.get("content-type", "")
    return status, head, json.loads(raw) if kind.startswith("application/json") else raw


def mp4_frames(data: bytes, tmp: pathlib.Path):
    """Decoded frames ``[F, H, W, 3]`` uint8 of mp4 bytes."""
    import imageio.v2 as imageio
    import numpy as np

    path = tmp / f"decode_{time.monotonic_ns()}.mp4"
    path.write_bytes(data)
    return np.stack(imageio.mimread(str(path), format="FFMPEG"))


def assert_same_video(a, b):
    """Two decoded mp4s of the same request (batched and alone) agree.

    The latents differ in the last float bits (wider matmuls); h264 then can move a whole
    macroblock's quantisation by a few levels, so the bound is on the bulk, not one pixel.
    Another seed or prompt differs by tens of levels on average."""
    import numpy as np

    a, b = np.asarray(a, np.int32), np.asarray(b, np.int32)
    assert a.shape == b.shape, (a.shape, b.shape)
    d = np.abs(a - b)
    assert d.mean() < 0.1 and (d > 2).mean() < 0.01 and d.max() <= 12, \
        (float(d.mean()), float((d > 2).mean()), int(d.max()))
