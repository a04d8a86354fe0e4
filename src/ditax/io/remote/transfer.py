"""Moving files between a local folder and a remote folder (fsspec), checked by size.

Downloads land under a hidden temporary name in the destination folder and are renamed into
place together once every size matches the remote one (:func:`ditax.io.outputs.staged`), so a
local copy is never a cut-short file under its real name. A local write that fails (the cache's
disk full, a quota, no permission) is :class:`~ditax.io.outputs.WriteFailed` naming the local
file (exit 1), a file that was there stays as it was; the network's and the store's failures
are :class:`~ditax.io.remote.urls.RemoteError`.

Uploads are listed back and compared by size before the caller writes its commit file (a
dataset's ``meta.json``, a checkpoint's ``commit_success.txt``): objects appear whole or not
at all on object stores, and the commit file goes last, so a reader never takes a half upload
for a finished one. :func:`host_lock` serialises processes of one host on
a local folder (``fcntl.flock`` on a ``.lock`` file beside it).
"""

from __future__ import annotations

import contextlib
import pathlib

from ditax.io.remote.urls import RemoteError, where


def join(root: str, name: str) -> str:
    return f"{root.rstrip('/')}/{name}" if name else root


def listing(fs, root: str) -> dict[str, int]:
    """Relative path → size of every file under ``root`` ({} when nothing is there)."""
    try:
        found = fs.find(root, detail=True)
    except FileNotFoundError:
        return {}
    base = fs._strip_protocol(root).rstrip("/") + "/"
    out = {}
    for name, info in found.items():
        name = fs._strip_protocol(name)
        if info.get("type") != "directory" and name.startswith(base):
            out[name[len(base):]] = int(info.get("size") or 0)
    return out


def listed(fs, root: str, url: str, what: str, error) -> tuple[dict, bool]:
    """``(listing(fs, root), whether root is a file)``; a filesystem that cannot list it
    (credentials, network) is ``error`` in one line naming ``what`` and ``url``."""
    try:
        there = listing(fs, root)
        return there, not there and fs.isfile(root)
    except Exception as e:  # noqa: BLE001 - credentials, network: one line
        raise error(f"{what} {url} cannot be listed ({type(e).__name__}: "
                    f"{str(e).strip()[:200]})") from None


def local_listing(folder: pathlib.Path, skip: tuple[str, ...] = ()) -> dict[str, int]:
    """Relative path → size of every file under ``folder`` (hidden temporaries and the top
    folders named in ``skip`` left out). A file removed while the folder is walked (orbax
    pruning an old checkpoint beside a background upload) is left out, not an error."""
    folder = pathlib.Path(folder)
    if not folder.is_dir():
        return {}
    out = {}
    for top in folder.iterdir():
        if top.name.startswith(".") or top.name in skip:
            continue
        for p in ([top] if not top.is_dir() else top.rglob("*")):
            rel = p.relative_to(folder)
            if any(part.startswith(".") for part in rel.parts):
                continue
            try:
                if p.is_file():
                    out[str(rel)] = p.stat().st_size
            except FileNotFoundError:
                continue
    return out


def download(fs, root: str, names, sizes: dict[str, int], folder: pathlib.Path,
             what: str) -> int:
    """Fetch ``names`` (relative to ``root``) into ``folder``; each checked against
    ``sizes``, then all renamed into place (module docstring). Returns the bytes fetched."""
    from ditax.io.outputs import staged

    folder = pathlib.Path(folder)
    names = list(names)
    if not names:
        return 0
    with staged() as stage:
        tmps = [stage.file(folder / name) for name in names]
        try:
            fs.get([join(root, n) for n in names], [str(t) for t in tmps])
        except Exception as e:  # noqa: BLE001 - network, permissions: one line
            if stage.failure(e) is not None:
                raise           # a local write's: WriteFailed naming the file (staged)
            raise RemoteError(f"{what}: could not download from {where(fs, root)} "
                              f"({type(e).__name__}: {str(e).strip()[:200]})") from None
        for name, tmp in zip(names, tmps):
            got = tmp.stat().st_size if tmp.exists() else -1
            if got != sizes[name]:
                raise RemoteError(f"{what}: {where(fs, join(root, name))} arrived with {got} "
                                  f"bytes, not its {sizes[name]}; the copy was dropped. Check "
                                  f"the connection and run again")
    return sum(sizes[n] for n in names)


def upload(fs, folder: pathlib.Path, names, root: str) -> None:
    """Put ``names`` (relative to local ``folder``) under ``root`` and check each arrived
    whole (sizes listed back); :class:`OSError` otherwise (the caller says what to do)."""
    folder = pathlib.Path(folder)
    names = list(names)
    if not names:
        return
    local, remote = [str(folder / n) for n in names], [join(root, n) for n in names]
    _with_parents(fs, remote, lambda: fs.put(local, remote))
    there = listing(fs, root)
    short = [n for n in names if there.get(n) != (folder / n).stat().st_size]
    if short:
        raise OSError(f"{len(short)} uploaded files are missing or of another size at "
                      f"{where(fs, root)} (e.g. {short[0]})")


def put_bytes(fs, path: str, data: bytes) -> None:
    """One small object (a commit file), written whole."""
    _with_parents(fs, [path], lambda: fs.pipe_file(path, data))


def _with_parents(fs, paths, write) -> None:
    """``write()``; where the filesystem has real folders (a local or SFTP path behind a
    URL: no parent is made for a file as on object stores), the parents of ``paths`` are
    made and it is tried again. Object stores never get a ``makedirs`` (on gs:// or s3:// it
    could create a bucket a typo named)."""
    try:
        write()
    except FileNotFoundError:
        for parent in sorted({p.rsplit("/", 1)[0] for p in paths if "/" in p}):
            fs.makedirs(parent, exist_ok=True)
        write()


def remove(fs, path: str) -> None:
    """``path`` and everything under it, gone (nothing there is fine)."""
    with contextlib.suppress(FileNotFoundError):
        if fs.exists(path):
            fs.rm(path, recursive=True)


def open_lock(lock: pathlib.Path):
    """The lock file ``lock`` opened for ``flock`` (made, with its folder, when missing); a
    disk that cannot take it (full, a quota, read-only) is :class:`~ditax.io.outputs.
    WriteFailed` naming it, as every write of ditax fails."""
    from ditax.io.outputs import WRITE_ERRORS, WriteFailed

    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        return open(lock, "a+")
    except OSError as e:
        if e.errno in WRITE_ERRORS:
            raise WriteFailed(lock, e.errno, kept=lock.exists()) from e
        raise


@contextlib.contextmanager
def host_lock(folder: pathlib.Path, *, wait: bool = True, busy: str = ""):
    """Hold an exclusive lock on ``folder`` among this host's processes; ``wait=False``
    raises :class:`RemoteError` (``busy``) instead of waiting when another holds it."""
    import fcntl

    with open_lock(pathlib.Path(f"{folder}.lock")) as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            raise RemoteError(busy or f"{folder} is in use by another process") from None
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


__all__ = ["join", "listing", "listed", "local_listing", "download", "upload", "put_bytes",
           "remove", "host_lock", "open_lock"]
