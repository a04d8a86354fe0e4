"""``ditax serve --uds PATH``: the server on a Unix domain socket (machines without TCP), with
the fixtures' stdlib client over that socket — one job from POST to its mp4; ``--uds`` with
``--host`` / ``--port`` is one line (exit 2); a socket file nothing answers on is replaced,
one a server answers on (or another file) is refused; the file goes when the server stops."""

from __future__ import annotations

import socket

import pytest
from serve_fixtures import SMALL, Server, request, shared_cache, short_socket_path

from ditax.cli import main
from ditax.cli.serve_listen import bind_uds
from ditax.errors import ConfigError


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("serve_uds"), uds=True,
                 cache=shared_cache(tmp_path_factory)).start()
    yield srv
    assert srv.stop() == 0, srv.log.read_text()[-2000:]
    assert not srv.uds.exists()          # the socket file went with the server


def test_a_job_over_the_socket(server):
    assert server.url.startswith("unix:") and server.port is None
    status, _, health = server.call("GET", "/health")
    assert status == 200 and health["ready"], health
    assert f"unix socket {server.uds}" in server.log.read_text()
    job = server.wait(server.submit(seed=3)["id"])
    assert job["status"] == "completed", job
    status, head, mp4 = server.call("GET", f"/v1/videos/{job['id']}/content")
    assert status == 200 and head["content-type"] == "video/mp4" and len(mp4) > 100
    status, _, err = server.call("POST", "/v1/videos", {"prompt": "x", **SMALL,
                                                        "num_frames": 6})
    assert status == 400 and err["error"]["param"] == "num_frames", err


def test_a_second_server_on_the_socket_is_refused(server):
    with pytest.raises(ConfigError, match="already listens"):
        bind_uds(str(server.uds))
    assert request(server.url, "GET", "/health")[0] == 200      # untouched


def test_uds_with_host_or_port_is_one_line(tmp_path, capsys):
    path = tmp_path / "s.sock"
    for extra in (["--port", "8001"], ["--host", "127.0.0.1"]):
        assert main(["serve", "--model", "demo", "--uds", str(path), *extra]) == 2
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert len(err) == 1 and "--uds" in err[0] and extra[0] in err[0], err
    assert not path.exists()


def test_stale_socket_files_are_replaced_and_other_files_refused(tmp_path):
    path = short_socket_path()
    try:
        old = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old.bind(str(path))
        old.close()                               # a server that is gone left its file
        sock = bind_uds(str(path))
        sock.listen()
        assert path.is_socket()
        sock.close()
    finally:
        path.unlink(missing_ok=True)
        path.parent.rmdir()
    other = tmp_path / "notes.txt"
    other.write_text("mine")
    with pytest.raises(ConfigError, match="not a socket"):
        bind_uds(str(other))
    assert other.read_text() == "mine"
    with pytest.raises(ConfigError, match="longer than"):
        bind_uds("/tmp/" + "x" * 120)
