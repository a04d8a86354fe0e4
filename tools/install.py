"""``python tools/install.py ARGS...``: ``pip install ARGS`` into this interpreter's environment,
done by uv (parallel downloads and unpacking, no byte-compiling step: a fresh ``make test``
install takes well under a minute instead of several).

uv does not read pip's configuration, so the package sources pip is configured with
(``pip config list``: ``index-url``, ``extra-index-url``, ``find-links``, ``constraint``, the
``cert`` file, and the ``PIP_*`` environment variables behind them) are passed on to it, and,
as pip does, every index is searched for the best match. Where uv cannot be installed or its
install fails, the same install runs with pip, and a line says so.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys

# pip's option -> uv's flag; every value may hold several, space-separated
_SOURCES = {"index-url": "--index-url", "extra-index-url": "--extra-index-url",
            "find-links": "--find-links", "constraint": "--constraint"}


def pip_settings() -> dict[str, list[str]]:
    """``pip config list``'s values per option name, in pip's order (environment last)."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                         text=True).stdout
    found: dict[str, list[str]] = {}
    # the environment's values last (pip's precedence: they override the files'), whatever
    # order pip prints them in
    lines = sorted(out.splitlines(), key=lambda line: line.startswith(":env:"))
    for line in lines:
        key, sep, value = line.partition("=")
        if not sep:
            continue
        name = key.rpartition(".")[2]
        try:                        # printed as a Python literal (multi-line values: "\n")
            value = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            value = value.strip().strip("'\"")
        for v in str(value).split():
            if v not in found.setdefault(name, []):
                found[name].append(v)
    return found


def uv_flags(settings: dict[str, list[str]]) -> list[str]:
    flags = ["--index-strategy", "unsafe-best-match"]
    for name, flag in _SOURCES.items():
        values = settings.get(name, [])
        if name == "index-url":     # pip takes one: the last (environment over files)
            values = values[-1:]
        for value in values:
            flags += [flag, value]
    return flags


def _uv() -> str | None:
    """The uv binary of this environment, installed (with pip, from pip's sources) if missing."""
    here = os.path.join(os.path.dirname(sys.executable), "uv")
    if not os.path.exists(here):
        rc = subprocess.call([sys.executable, "-m", "pip", "install", "-q", "uv"])
        if rc != 0:
            return None
    return here if os.path.exists(here) else shutil.which("uv")


def main(args: list[str]) -> int:
    settings = pip_settings()
    uv = _uv()
    if uv is not None:
        env = dict(os.environ)
        if settings.get("cert") and "SSL_CERT_FILE" not in env:
            env["SSL_CERT_FILE"] = settings["cert"][-1]
        rc = subprocess.call([uv, "pip", "install", "-q", "--python", sys.executable,
                              *uv_flags(settings), *args], env=env)
        if rc == 0:
            return 0
        print(f"install: uv pip install failed (exit {rc}); installing with pip instead",
              file=sys.stderr)
    else:
        print("install: uv could not be installed; installing with pip", file=sys.stderr)
    return subprocess.call([sys.executable, "-m", "pip", "install", "-q", *args])


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
