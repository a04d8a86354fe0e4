"""A real PostgreSQL server for the tests of the shared job store (``ditax serve --db
postgresql://...``): ``initdb`` + ``pg_ctl`` in a temporary folder, listening on 127.0.0.1 at a
free port, trusted local logins, fsync off. Found on PATH or under
``/usr/lib/postgresql/*/bin`` (Debian's ``postgresql``, which ``.ci/run`` installs); as root
the server runs as the ``postgres`` user (PostgreSQL refuses root). The tests that use it skip
with one line where PostgreSQL or psycopg is missing.

Use: ``from pg_fixtures import postgres  # noqa: F401`` in a test module, then
``postgres.database()`` for a new empty database's URL.
"""

from __future__ import annotations

import glob
import os
import pathlib
import shutil
import subprocess
import tempfile
import uuid

import pytest

from serve_fixtures import free_port

USER = "ditax"


def pg_bin() -> pathlib.Path | None:
    """The folder of ``initdb`` and ``pg_ctl`` (PATH first, then Debian's folders, newest
    version first); None where there is none."""
    found = shutil.which("initdb")
    if found and os.path.exists(pathlib.Path(os.path.realpath(found)).parent / "pg_ctl"):
        return pathlib.Path(os.path.realpath(found)).parent
    for folder in sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                         key=lambda f: int(pathlib.Path(f).parent.name)
                         if pathlib.Path(f).parent.name.isdigit() else 0, reverse=True):
        if os.path.exists(f"{folder}/initdb") and os.path.exists(f"{folder}/pg_ctl"):
            return pathlib.Path(folder)
    return None


class Postgres:
    """A running server: :attr:`port`, :meth:`database` (a fresh database's URL)."""

    def __init__(self, bin_dir: pathlib.Path):
        self.bin = bin_dir
        self.base = pathlib.Path(tempfile.mkdtemp(prefix="ditax_pg_"))
        self.data = self.base / "data"
        self.port = free_port()
        self.prefix: list[str] = []
        if os.geteuid() == 0:           # initdb and postgres refuse to run as root
            import pwd

            try:
                pw = pwd.getpwnam("postgres")
            except KeyError:
                shutil.rmtree(self.base, ignore_errors=True)
                pytest.skip("running as root and there is no 'postgres' user to run "
                            "PostgreSQL as (apt-get install postgresql makes one)")
            os.chown(self.base, pw.pw_uid, pw.pw_gid)
            self.prefix = ["runuser", "-u", "postgres", "--"]

    def run(self, *cmd: str) -> None:
        out = subprocess.run([*self.prefix, *cmd], capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {out.returncode}:\n{out.stdout}\n"
                               f"{out.stderr}\n{self.log_tail()}")

    def log_tail(self) -> str:
        log = self.base / "server.log"
        return log.read_text()[-2000:] if log.exists() else ""

    def start(self) -> "Postgres":
        self.run(str(self.bin / "initdb"), "-D", str(self.data), "-U", USER, "-A", "trust",
                 "-E", "UTF8", "--no-locale", "--no-sync")
        options = (f"-h 127.0.0.1 -p {self.port} -k {self.base} -c fsync=off "
                   f"-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
        self.run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l",
                 str(self.base / "server.log"), "-w", "-t", "60", "-o", options, "start")
        return self

    @property
    def url(self) -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/postgres"

    def database(self) -> str:
        """The URL of a new empty database (each test its own job table)."""
        import psycopg

        name = f"jobs_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        if self.data.exists():
            subprocess.run([*self.prefix, str(self.bin / "pg_ctl"), "-D", str(self.data), "-m",
                            "immediate", "-w", "stop"], capture_output=True, timeout=60)
        shutil.rmtree(self.base, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres():
    """A PostgreSQL server for the session (skips with one line without PostgreSQL or
    psycopg)."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("psycopg 3 is not installed (pip install 'ditax[test]')")
    bin_dir = pg_bin()
    if bin_dir is None:
        pytest.skip("PostgreSQL's initdb / pg_ctl not found on PATH or under "
                    "/usr/lib/postgresql/*/bin (apt-get install postgresql)")
    server = Postgres(bin_dir)
    try:
        server.start()
        yield server
    finally:
        server.stop()
