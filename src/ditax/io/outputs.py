"""Output paths checked before the work, and written whole or not at all.

A generation can take minutes; finding out only at the end that ``--output`` is a folder, or
that its parent cannot be created, wastes it. :func:`check_output_file` and
:func:`check_output_folder` look at a path without creating anything (the nearest existing
ancestor must be a writable folder) and raise :class:`~ditax.errors.RequestError` naming the
flag, the path and the fix (:func:`check_writable_parent` serves ``output_dir`` configs too).

:func:`atomic_file` / :func:`atomic_folder` write to a hidden temporary sibling
(``.NAME.partial-PID…``, same folder, so the final rename stays on one file system) and rename
it to the real name only when the writing finished: a failure removes the temporary, and a
killed process leaves at most that ``.partial`` sibling, never a half-written file or PNG set
under the name the user asked for.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import tempfile

from ditax.errors import RequestError
from ditax.io.files import path_arg


def check_writable_parent(path, flag: str, *, sep: str = " ", error=RequestError) -> None:
    """The nearest existing ancestor of ``path`` is a folder this process can create entries
    in. Tried for real (a temporary folder made and removed at once), so a read-only file
    system or ``/proc`` is caught even for root, whom permission bits do not stop. Messages
    name ``{flag}{sep}{path}`` (``--output x.mp4``, ``output_dir=runs/a``)."""
    path = path_arg(path, flag, error)
    parent = path.parent
    while not parent.exists():
        if parent.is_symlink():      # a dangling link: mkdir would fail on it
            raise error(f"{flag}{sep}{path}: {parent} is a broken symbolic link; point "
                        f"{flag} elsewhere")
        parent = parent.parent
    if not parent.is_dir():
        raise error(f"{flag}{sep}{path}: {parent} is a file, not a folder; choose a path "
                    f"whose parent is a folder")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".ditax-probe-", dir=parent))
    except OSError as e:
        raise error(f"{flag}{sep}{path}: the folder {parent} is not writable "
                    f"({e.strerror or type(e).__name__}); choose a path you can write to"
                    ) from None


def check_output_file(path, flag: str = "--output", example: str = "out.mp4") -> pathlib.Path:
    """``path`` can be written as a file: not an existing folder, parent creatable and
    writable (an existing file is replaced at the end). Nothing is created. ``example``: a
    file name to suggest inside a folder given by mistake."""
    path = path_arg(path, flag, RequestError, "a file name")
    if path.is_dir():
        raise RequestError(f"{flag} {path} is an existing folder; give a file name inside it, "
                           f"e.g. {flag} {path / example}")
    check_writable_parent(path, flag)
    if path.exists() and not os.access(path, os.W_OK):
        raise RequestError(f"{flag} {path} exists and is not writable; choose another name")
    return path


def check_output_folder(path, flag: str = "--frames-dir") -> pathlib.Path:
    """``path`` can become a folder of new files: not an existing file, not an existing
    non-empty folder (its files would mix with the new ones), parent creatable and writable."""
    path = path_arg(path, flag, RequestError, "a folder name")
    if path.exists() and not path.is_dir():
        raise RequestError(f"{flag} {path} is an existing file, not a folder; choose a new "
                           f"folder name")
    if path.is_dir() and any(path.iterdir()):
        raise RequestError(f"{flag} {path} is a folder that already has files; choose a new or "
                           f"empty folder, or empty it first (frames of two runs would mix)")
    check_writable_parent(path, flag)
    return path


def _partial(path: pathlib.Path) -> pathlib.Path:
    # keeps the suffix: writers that pick the format from it (ffmpeg: .mp4) still can
    return path.with_name(f".{path.stem}.partial-{os.getpid()}{path.suffix}")


@contextlib.contextmanager
def atomic_file(path):
    """Yield a temporary path beside ``path``; on success it replaces ``path``, on an error
    it is removed."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _partial(path)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_folder(path):
    """Yield a new temporary folder beside ``path``; on success it becomes ``path`` (which
    must not exist or be empty), on an error it is removed with what was written."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _partial(path)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        if path.is_dir() and not any(path.iterdir()):
            path.rmdir()
        os.rename(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)



def extra_path(main, kind: str) -> pathlib.Path:
    """Where a request's extra output ``kind`` goes beside its main output ``main``:
    ``out.mp4`` → ``out.<kind>.npy``."""
    main = pathlib.Path(main)
    return main.with_name(f"{main.stem}.{kind}.npy")


def write_extras(main, outputs: dict) -> list[pathlib.Path]:
    """Write each extra output (``{kind: array}``, beside the main output ``main``) whole, as a
    ``.npy`` array at :func:`extra_path`; returns the paths. (A family whose extra output has a
    file format of its own — audio — adds its writer here.)"""
    import numpy as np

    paths = []
    for kind, array in outputs.items():
        path = extra_path(main, kind)
        with atomic_file(path) as tmp:
            with open(tmp, "wb") as f:
                np.save(f, np.asarray(array))
        paths.append(path)
    return paths


__all__ = ["atomic_file", "atomic_folder", "check_output_file", "check_output_folder",
           "check_writable_parent", "extra_path", "write_extras"]
