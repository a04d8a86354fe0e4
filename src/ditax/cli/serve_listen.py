"""Where ``ditax serve`` listens: ``--host`` / ``--port`` (TCP, 127.0.0.1:8000 unless told), or
``--uds PATH``, a Unix domain socket (machines without TCP, a proxy on the same host).

Each address is checked before the model loads (one line, exit 2) and bound before any job is
claimed (:func:`listen`): a port in use, or a socket file another server answers on, ends the
start there. A socket file left by a server that is gone (nothing answers on it) is replaced;
any other file at the path is refused. The socket file is removed when the server stops.
"""

from __future__ import annotations

import errno
import os
import pathlib
import socket
import stat

from ditax.errors import ConfigError

HOST, PORT = "127.0.0.1", 8000


def add_arguments(p) -> None:
    p.add_argument("--host", default=None, help=f"address to bind ({HOST})")
    p.add_argument("--port", type=int, default=None, help=f"port to bind ({PORT}; 0: any)")
    p.add_argument("--uds", default=None, metavar="PATH",
                   help="listen on this Unix domain socket instead of a TCP port (not with "
                        "--host / --port); e.g. curl --unix-socket PATH http://x/health")


def address_args(args) -> None:
    """``--uds`` or ``--host`` / ``--port`` (their defaults filled in): one line if both are
    given or the port is out of range (no system call: every process of a group checks it)."""
    if args.uds is not None:
        given = [f for f, v in (("--host", args.host), ("--port", args.port)) if v is not None]
        if given:
            raise ConfigError(f"--uds {args.uds} and {' / '.join(given)} both say where to "
                              f"listen; give --uds PATH (a Unix socket) or --host / --port "
                              f"(TCP), not both")
        return
    args.host = HOST if args.host is None else args.host
    args.port = PORT if args.port is None else args.port
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port={args.port} must be >= 0 and <= 65535")


def check_address(args) -> None:
    """The address of :func:`address_args` can be bound here: ``--host`` resolves, ``--uds``
    is a path a socket can take (before the model loads)."""
    if args.uds is not None:
        check_uds(args.uds)
    else:
        check_host(args.host, args.port)


def check_host(host: str, port: int) -> None:
    """``--host`` resolves to an address to bind (one line otherwise, before the model
    loads)."""
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        raise ConfigError(f"--host {host!r} does not resolve ({e}); give an address of this "
                          f"machine, e.g. --host 127.0.0.1 (or 0.0.0.0 for every interface)") \
            from None


def check_uds(path: str) -> None:
    """``--uds PATH``: a Unix socket platform, a path that fits ``sockaddr_un``, a folder that
    exists, and nothing but a socket file at the path."""
    if not hasattr(socket, "AF_UNIX"):
        raise ConfigError("--uds needs Unix domain sockets, which this platform lacks; use "
                          "--host / --port")
    p = pathlib.Path(path)
    if len(os.fsencode(path)) > 107:
        raise ConfigError(f"--uds {path}: {len(os.fsencode(path))} bytes, longer than a Unix "
                          f"socket path may be (107); choose a shorter path, e.g. /tmp/ditax.sock")
    if not p.parent.is_dir():
        raise ConfigError(f"--uds {path}: the folder {p.parent} does not exist; create it or "
                          f"choose another path")
    if p.exists() and not stat.S_ISSOCK(p.stat().st_mode):
        raise ConfigError(f"--uds {path} exists and is not a socket; remove it or choose "
                          f"another path (nothing is overwritten)")


def listen(args) -> socket.socket:
    """A listening-ready socket bound to ``--uds`` or ``--host`` / ``--port`` (one
    :class:`ConfigError` line when the address is taken or not this machine's)."""
    if args.uds is not None:
        return bind_uds(args.uds)
    return bind(args.host, args.port)


def bind(host: str, port: int) -> socket.socket:
    """A listening-ready TCP socket bound to ``host:port``."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET,
                         socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ConfigError(f"--host {host} --port {port}: cannot listen there ({e.strerror or e});"
                          f" choose a free --port (0: any) or an address of this machine") \
            from None
    return sock


def bind_uds(path: str) -> socket.socket:
    """A listening-ready Unix socket at ``path``; a socket file there that nothing answers on
    (a server that is gone) is replaced, one a server answers on is refused."""
    check_uds(path)
    if os.path.exists(path):
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except OSError as e:
            if e.errno not in (errno.ECONNREFUSED, errno.ENOENT):
                why = e.strerror or e
                raise ConfigError(f"--uds {path}: cannot check the socket there ({why}); "
                                  f"choose another path") from None
            os.unlink(path)           # stale: its server is gone
        else:
            raise ConfigError(f"--uds {path}: a server already listens there; stop it or "
                              f"choose another path")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
    except OSError as e:
        sock.close()
        raise ConfigError(f"--uds {path}: cannot listen there ({e.strerror or e}); choose "
                          f"another path") from None
    return sock


def where(args, sock: socket.socket) -> str:
    """The address ``sock`` serves, for the start line."""
    if args.uds is not None:
        return f"unix socket {args.uds}"
    return f"http://{args.host}:{sock.getsockname()[1]}"     # --port 0: the one chosen


def uvicorn_address(args, sock: socket.socket) -> dict:
    """uvicorn.Config's address arguments (for its messages: it serves on ``sock``)."""
    if args.uds is not None:
        return {"uds": args.uds}
    return {"host": args.host, "port": sock.getsockname()[1]}


def close(args, sock: socket.socket) -> None:
    """After the server: a Unix socket's file goes (the next server binds a fresh one)."""
    sock.close()
    if args.uds is not None:
        try:
            if stat.S_ISSOCK(os.stat(args.uds).st_mode):
                os.unlink(args.uds)
        except OSError:
            pass


__all__ = ["HOST", "PORT", "add_arguments", "address_args", "bind", "bind_uds", "check_address",
           "check_host", "check_uds", "close", "listen", "uvicorn_address", "where"]
