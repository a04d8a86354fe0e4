"""Which paths are URLs, and the fsspec filesystem of a URL, checked before any work.

A path is a URL when it starts with ``PROTOCOL://`` (``gs://bucket/x``, ``s3://bucket/x``,
``memory://x``; fsspec's chained ``simplecache::gs://...`` too); anything else is a local
path and stays exactly as ditax always read it (nothing here is imported for it).
``file:///abs/path`` is the local path ``/abs/path`` (:func:`local_file`), read and written in
place: no mirror, no staging.

:func:`filesystem` turns a URL into ``(fs, path)`` or raises one line (:class:`RemoteError`,
a :class:`~ditax.errors.ConfigError`, exit 2) naming the URL and what is wrong: an unknown
protocol, a filesystem whose package is not installed (the package to ``pip install``, from
fsspec's own table: ``gs://`` → ``gcsfs``, ``s3://`` → ``s3fs``, ``az://`` → ``adlfs``), a
URL with no bucket or folder, an empty bucket (``gs:///x``), a filesystem that cannot be
opened. :func:`check_path_or_url` also catches ``gs:/bucket`` (one slash), which would
otherwise silently become a local folder named ``gs:``.

:func:`resolve` is the one rule every path-or-URL a user gives goes through (dataset folders:
``ditax preprocess`` OUT, ``data.source``; runs: ``output_dir``; exports: ``--out``; served
and generated outputs): a local path is itself, ``file://`` is the local path, another URL is
handed to the remote code — refused where only a local folder can work, and for an output
another process must read when its storage dies with this process (``memory://``,
:data:`IN_PROCESS`).
"""

from __future__ import annotations

import os
import pathlib
import re

from ditax.errors import ConfigError


class RemoteError(ConfigError):
    """A URL that cannot be used as asked (malformed, unknown protocol, package missing,
    nothing there, the wrong thing there); one line naming the URL and the fix (exit 2)."""


_URL = re.compile(r"^[^/\s]+://")
_ONE_SLASH = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):/(?!/)")
# protocols whose first path part is a bucket / container (``gs:///x`` names none)
BUCKETED = {"gs", "gcs", "s3", "s3a", "az", "abfs", "abfss", "adl", "oci", "oss", "tos", "hf"}


def is_url(value) -> bool:
    """``value`` is a ``PROTOCOL://...`` string (``file://`` included)."""
    return isinstance(value, str) and bool(_URL.match(value.strip()))


def is_remote(value) -> bool:
    """``value`` is a URL of a filesystem other than the local one (not ``file://``):
    what ditax mirrors (datasets) or stages and uploads (runs, exports)."""
    return is_url(value) and not value.strip().lower().startswith("file://")


def local_file(url: str, what: str, error=RemoteError) -> pathlib.Path:
    """The local path of a ``file://`` URL: ``file:///abs/path`` or
    ``file://localhost/abs/path``; any other host is refused."""
    rest = url.strip()[len("file://"):]
    if rest.startswith("localhost/"):
        rest = rest[len("localhost"):]
    if not rest.startswith("/") or not rest.strip("/"):
        raise error(f"{what}={url}: a file URL names an absolute local path, "
                    f"file:///ABSOLUTE/PATH (three slashes); or give the path itself")
    return pathlib.Path(rest)


#: protocols whose storage lives in this process only (fsspec's in-process store): what is
#: written there is gone when the command ends
IN_PROCESS = ("memory",)


def resolve(value, what: str, *, error=RemoteError, expected: str = "a path",
            remote: bool = True, output: bool = True):
    """Where ``value`` (a path or URL the user gave as ``what``) is, by the one rule for them
    all: a local path is that ``pathlib.Path`` (``gs:/x``, a URL with one slash, refused);
    ``file:///abs/path`` is the local ``Path("/abs/path")``; any other URL is returned as
    text (stripped), for the remote code to check and use. Refused, in one line of
    ``error`` naming ``what``, the value and the fix: a URL where only a local path works
    (``remote=False``: a video written, a folder served), and, for an ``output`` (what
    another process reads: a dataset, a run, an export), a URL whose storage does not outlive
    this process (:data:`IN_PROCESS`)."""
    from ditax.io.files import path_arg

    path_arg(value, what, error, expected)
    if not is_url(value):
        check_path_or_url(value, what, error)
        return pathlib.Path(value)
    if not is_remote(value):
        return local_file(value, what, error)
    url = value.strip()
    if not remote:
        raise error(f"{what}={url}: this is written and read as a local path, not at a URL; "
                    f"give a local path (or file:///ABSOLUTE/PATH), e.g. a mounted bucket's")
    gone = [p for p in protocols(url) if p in IN_PROCESS]
    if output and gone:
        raise error(f"{what}={url}: {gone[0]}:// is this process's own in-memory store, gone "
                    f"when the command ends, so no other process (ditax train, generate, "
                    f"serve) could read what is written there; give a local folder, "
                    f"file:///ABSOLUTE/PATH or a bucket URL (gs://, s3://)")
    return url


def check_path_or_url(value, what: str, error=RemoteError) -> None:
    """Refuse ``PROTOCOL:/x`` (one slash) when PROTOCOL is a filesystem fsspec knows: a URL
    typed wrong, which as a path would create a folder named ``PROTOCOL:``."""
    if not isinstance(value, str) or is_url(value):
        return
    m = _ONE_SLASH.match(value.strip())
    if m and m.group(1).lower() in _known():
        fixed = f"{m.group(1)}://{value.strip()[m.end():]}"
        raise error(f"{what}={value} is no URL (one slash after '{m.group(1)}:'); write "
                    f"{fixed}, or ./{value} for a local folder of that name")


def _known() -> set[str]:
    from fsspec.registry import known_implementations, registry

    return set(known_implementations) | set(registry)


def protocols(url: str) -> list[str]:
    """The protocols of ``url``, outermost first (``simplecache::gs://b`` → simplecache, gs)."""
    return [part.split("://", 1)[0].lower() if "://" in part else part.lower()
            for part in url.strip().split("::")]


def package_for(protocol: str) -> str | None:
    """The pip package that provides ``protocol``'s filesystem (fsspec's table), or None for
    one of fsspec's own filesystems."""
    from fsspec.registry import known_implementations

    cls = known_implementations.get(protocol, {}).get("class", "")
    top = cls.split(".", 1)[0]
    return None if not top or top == "fsspec" else top.replace("_", "-")


def filesystem(url: str, what: str, error=RemoteError):
    """``(fs, path)`` of a remote URL (fsspec), or ``error`` in one line: unknown protocol,
    package not installed, no bucket / folder, a filesystem that cannot be opened."""
    import fsspec

    text = url.strip()
    rest = text.rsplit("::", 1)[-1].split("://", 1)[1] if "://" in text else ""
    for proto in protocols(text):
        if proto not in _known():
            raise error(f"{what}={url}: unknown protocol '{proto}://' (no fsspec filesystem of "
                        f"that name is known); use gs://, s3://, memory://... with the "
                        f"filesystem's package installed, or a local path")
        try:
            fsspec.get_filesystem_class(proto)
        except ImportError as e:
            pkg = package_for(proto)
            need = (f"the package {pkg}, which is not installed; pip install {pkg}" if pkg
                    else f"packages that are not installed ({e})")
            raise error(f"{what}={url}: the {proto}:// filesystem needs {need}") from None
    last = protocols(text)[-1]
    if not rest.strip("/"):
        raise error(f"{what}={url} names no bucket or folder; write {last}://BUCKET/PATH")
    if last in BUCKETED and rest.startswith("/"):
        raise error(f"{what}={url}: the bucket name is empty ({last}:///...); write "
                    f"{last}://BUCKET/PATH")
    try:
        fs, path = fsspec.core.url_to_fs(text)
    except Exception as e:  # noqa: BLE001 - credentials, options: said in one line
        raise error(f"{what}={url}: the {last}:// filesystem cannot be opened "
                    f"({type(e).__name__}: {_first_line(e)})") from None
    return fs, path.rstrip("/")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__


def slug(url: str) -> str:
    """A folder name for ``url`` in a cache: readable tail + a hash of the whole URL."""
    import hashlib

    tail = re.sub(r"[^A-Za-z0-9._-]+", "_", url.strip().rstrip("/"))[-60:].strip("_.")
    return f"{tail}-{hashlib.sha256(url.strip().rstrip('/').encode()).hexdigest()[:12]}"


ENV = "DITAX_REMOTE_CACHE"


def cache_root() -> pathlib.Path:
    """Where this host keeps the local copies of remote things (dataset mirrors, run and
    export staging): ``$DITAX_REMOTE_CACHE``, else ``$XDG_CACHE_HOME/ditax/remote``
    (``~/.cache/ditax/remote``)."""
    env = os.environ.get(ENV, "").strip()
    if env:
        return pathlib.Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "ditax" / "remote"


def where(fs, path: str) -> str:
    """``path`` of ``fs`` as a URL again, for messages."""
    return fs.unstrip_protocol(path)


__all__ = ["RemoteError", "IN_PROCESS", "is_url", "is_remote", "local_file", "resolve",
           "check_path_or_url",
           "filesystem", "package_for", "protocols", "slug", "cache_root", "where", "ENV"]
