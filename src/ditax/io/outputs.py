"""Output paths checked before the work, and written whole or not at all.

A generation can take minutes; finding out only at the end that ``--output`` is a folder, or
that its parent cannot be created, wastes it. :func:`check_output_file` and
:func:`check_output_folder` look at a path without creating anything (the nearest existing
ancestor must be a writable folder) and raise :class:`~ditax.errors.RequestError` naming the
flag, the path and the fix (:func:`check_writable_parent` serves ``output_dir`` configs too).
Both take a path as :func:`ditax.io.remote.urls.resolve` reads it: ``file:///abs/x`` is the
local ``/abs/x``; any other URL is refused (these outputs are local files).

**Written whole** (:func:`staged`: the one mechanism every writer of ditax goes through —
videos, PNGs, sound, extra arrays, datasets, exports, the server's results). Each output is
written under a hidden temporary sibling (``.NAME.partial-PID…``, same folder, so the rename
stays on one file system); when the writing is done its files are flushed to the disk
(``fsync``: a write error a file system reports late is still caught) and only then renamed
to the name asked for, the outputs of one request (an mp4, its PNG frames, its extra arrays)
together, at the end. A failure removes every temporary and raises :class:`WriteFailed`: one
line naming the file asked for, the cause (the disk full, a quota, a file-size limit, no
permission, a read-only file system: the writer's own error, an ``OSError`` or a C++ / Rust
writer's text naming one) and the fix. Nothing is left under that name, and a file that was
there before is kept as it was. A killed process leaves at most the hidden ``.partial``
siblings. :func:`atomic_file` / :func:`atomic_folder` are one output's :func:`staged`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pathlib
import re
import shutil
import tempfile

from ditax.errors import RequestError
from ditax.io.files import path_arg

#: the os errors a write fails with: what each means and its fix
WRITE_ERRORS = {
    errno.ENOSPC: ("no space left on device (the disk is full)",
                   "free space there or write to another disk"),
    errno.EDQUOT: ("the disk quota is used up", "raise the quota or free space under it"),
    errno.EFBIG: ("a file outgrew the file-size limit (ulimit -f)",
                  "raise the limit (ulimit -f unlimited)"),
    errno.EROFS: ("the file system is read-only", "write to another place"),
    errno.EACCES: ("permission denied", "write to a folder you may write to"),
    errno.EPERM: ("operation not permitted", "write to a folder you may write to"),
    errno.EIO: ("an input/output error of the disk", "check the disk and run again"),
    errno.EEXIST: ("a part of its path is a file, not a folder", "move it or write elsewhere"),
    errno.ENOTDIR: ("a part of its path is a file, not a folder", "move it or write elsewhere"),
}
#: codes nothing but a write fails with: taken as the write's failure wherever reported
ONLY_WRITES = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS})
# "[Errno 28]" (Python), "(os error 28)" (Rust), "os_error_code=28" (tensorstore)
_CODE = re.compile(r"\[Errno (\d+)\]|os error (\d+)|os_error_code='?(\d+)")


class WriteFailed(OSError):
    """An output could not be written whole (disk full, quota, file-size limit, permission,
    read-only file system, a writer that reported an error): nothing was left under its name
    and what was there before is unchanged. ``path``: the output asked for; ``errno``: the
    os error when known; ``detail``: the writer's own words (ffmpeg's error line)."""

    def __init__(self, path, code: int | None = None, detail: str = "", kept: bool = False):
        self.path, self.detail, self.kept = pathlib.Path(path), detail, kept
        what, fix = WRITE_ERRORS.get(code, (
            os.strerror(code) if code else "the writer failed",
            "check the disk and the path, and run again"))
        said = f"{what}; {detail}" if detail else what
        left = (f"{self.path} is as it was before" if kept
                else "nothing was left under that name")
        self.message = f"could not write {self.path}: {said}; {fix} ({left})"
        super().__init__(code, self.message)

    def __str__(self) -> str:
        return self.message


def write_code(text: str) -> int | None:
    """The os error a writer's message names (its errno, or its ``strerror`` words, such as
    ffmpeg's ``No space left on device``), when it is one of :data:`WRITE_ERRORS`."""
    m = _CODE.search(text)
    if m:
        code = int(next(g for g in m.groups() if g))
        return code if code in WRITE_ERRORS else None
    return next((c for c in WRITE_ERRORS if os.strerror(c) in text), None)


def _partial(path: pathlib.Path) -> pathlib.Path:
    # keeps the suffix: writers that pick the format from it (PIL: .png) still can
    return path.with_name(f".{path.stem}.partial-{os.getpid()}{path.suffix}")


def _remove(path: pathlib.Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _flush(path: pathlib.Path) -> None:
    """Every file under ``path`` (or ``path`` itself) on the disk (``fsync``); links are the
    files of others (an export's ``--link``) and left alone."""
    files = [path] if not path.is_dir() else [
        pathlib.Path(d, f) for d, _, names in os.walk(path) for f in names]
    for f in files:
        if f.is_symlink():
            continue
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class Staging:
    """The outputs of one :func:`staged` write: each written under a temporary name
    (:meth:`file`, :meth:`folder`), renamed to its own at :meth:`commit`."""

    def __init__(self):
        self.items: list[tuple[pathlib.Path, pathlib.Path, bool]] = []   # tmp, final, folder

    def _begin(self, path, folder: bool) -> pathlib.Path:
        path = pathlib.Path(path)
        tmp = _partial(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            _remove(tmp)                 # a killed earlier write of this process id
            if folder:
                tmp.mkdir()
        except OSError as e:
            raise WriteFailed(path, e.errno, f"while making {e.filename}" if e.filename else "",
                              path.exists()) from e
        self.items.append((tmp, path, folder))
        return tmp

    def file(self, path) -> pathlib.Path:
        """The temporary path to write the file ``path`` to (its parents are made)."""
        return self._begin(path, False)

    def folder(self, path) -> pathlib.Path:
        """A new temporary folder to write the folder ``path``'s files into (``path`` must
        not exist or be empty when it is renamed)."""
        return self._begin(path, True)

    def commit(self) -> None:
        """Flush every output to the disk, then rename each to its name."""
        for tmp, path, _ in self.items:
            try:
                _flush(tmp)
            except FileNotFoundError as e:
                raise WriteFailed(path, None, f"the writer left no file ({e.filename})") from e
            except OSError as e:        # reported late, at the flush (NFS, a quota)
                raise WriteFailed(path, e.errno, "", path.exists()) from e
        for tmp, path, folder in self.items:
            try:
                if folder and path.is_dir() and not any(path.iterdir()):
                    path.rmdir()
                (os.rename if folder else os.replace)(tmp, path)
            except OSError as e:
                raise WriteFailed(path, e.errno, f"renaming {tmp.name}: {e.strerror or e}",
                                  path.exists()) from e

    def discard(self) -> None:
        """Remove every temporary left (all of them after a failure)."""
        for tmp, _, _ in self.items:
            _remove(tmp)

    def failure(self, e: BaseException) -> WriteFailed | None:
        """:class:`WriteFailed` naming the output ``e`` broke, when ``e`` (or an error it was
        raised from) is a write's failure: an os error nothing but a write has
        (:data:`ONLY_WRITES`), any os error of a file being written here, another
        :class:`WriteFailed`; None for anything else (a bad request, an interrupt) and for a
        :class:`WriteFailed` that already names its own file (one of this stage's, or one it
        could not begin: ``e`` is raised as it is).

        The output named: the one whose temporary the error names; for an error that names
        none (Python's ``write`` on a full disk, a writer's text), the one being written when
        it failed (:meth:`_writing`), and another file the error names (a cache the writer
        fills) is said too."""
        top, seen = e, set()
        while self.items and e is not None and id(e) not in seen:
            seen.add(id(e))
            if isinstance(e, WriteFailed):
                item = self._mine(str(e.path))
                if item is not None:        # a writer named the temporary it was given
                    return self._failed(item, e.errno, e.detail)
                return None if e is top else WriteFailed(e.path, e.errno, e.detail, e.kept)
            names = " ".join(str(n) for n in (getattr(e, "filename", None),
                                               getattr(e, "filename2", None)) if n)
            code = getattr(e, "errno", None) if isinstance(e, OSError) else None
            text = names if code is not None else str(e)
            code = code if code is not None else write_code(text)
            item = self._mine(text)
            if code is not None and item is not None:
                return self._failed(item, code)
            if code in ONLY_WRITES:
                return self._failed(self._writing(), code, f"writing {names}" if names else "")
            e = e.__cause__ or e.__context__
        return None

    def _mine(self, text: str) -> tuple | None:
        """The output (tmp, final, folder) whose temporary ``text`` names (the longest such
        name: ``.a.partial-7`` is inside ``.a.partial-7.bin``), or None."""
        hits = [i for i in self.items if str(i[0]) in text]
        return max(hits, key=lambda i: len(str(i[0]))) if hits else None

    def _writing(self) -> tuple:
        """The output being written when an error that names no file came: of the temporaries
        there, the one modified last (a tie, as coarse file-system clocks give: the one begun
        later); none there yet: the one begun last."""
        made = [(t, n, i) for n, i in enumerate(self.items)
                if (t := _modified(i[0])) is not None]
        return max(made)[2] if made else self.items[-1]

    @staticmethod
    def _failed(item: tuple, code, detail: str = "") -> WriteFailed:
        _, path, _ = item
        return WriteFailed(path, code, detail, path.exists())


def _modified(path: pathlib.Path) -> int | None:
    """The newest modification time (ns) of ``path`` or of anything under it; None when it
    is not there."""
    try:
        times = [path.lstat().st_mtime_ns]
    except OSError:
        return None
    if path.is_dir() and not path.is_symlink():
        for folder, dirs, files in os.walk(path):
            for name in dirs + files:
                with contextlib.suppress(OSError):
                    times.append(os.lstat(os.path.join(folder, name)).st_mtime_ns)
    return max(times)


@contextlib.contextmanager
def staged(within: Staging | None = None):
    """Write outputs whole (module docstring): ``with staged() as s: tmp = s.file(path)`` …
    ``within``: a :class:`Staging` of a larger write (the other outputs of one request), whose
    own ``staged`` renames these with the others; then nothing happens here."""
    if within is not None:
        yield within
        return
    stage = Staging()
    try:
        yield stage
        stage.commit()
    except BaseException as e:
        failed = stage.failure(e)
        if failed is None:
            raise
        raise failed from e
    finally:
        stage.discard()


@contextlib.contextmanager
def atomic_file(path, within: Staging | None = None):
    """Yield a temporary path beside ``path``; on success it replaces ``path``, on an error
    it is removed (:func:`staged`)."""
    with staged(within) as stage:
        yield stage.file(path)


@contextlib.contextmanager
def atomic_folder(path, within: Staging | None = None):
    """Yield a new temporary folder beside ``path``; on success it becomes ``path`` (which
    must not exist or be empty), on an error it is removed with what was written."""
    with staged(within) as stage:
        yield stage.folder(path)


def _local(path, flag: str, expected: str) -> pathlib.Path:
    from ditax.io.remote.urls import resolve

    return resolve(path, flag, error=RequestError, expected=expected, remote=False)


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
    file name to suggest inside a folder given by mistake. Returns the local path (a
    ``file://`` URL's)."""
    path = _local(path, flag, "a file name")
    if path.is_dir():
        raise RequestError(f"{flag} {path} is an existing folder; give a file name inside it, "
                           f"e.g. {flag} {path / example}")
    check_writable_parent(path, flag)
    if path.exists() and not os.access(path, os.W_OK):
        raise RequestError(f"{flag} {path} exists and is not writable; choose another name")
    return path


def check_output_folder(path, flag: str = "--frames-dir") -> pathlib.Path:
    """``path`` can become a folder of new files: not an existing file, not an existing
    non-empty folder (its files would mix with the new ones), parent creatable and writable.
    Returns the local path (a ``file://`` URL's)."""
    path = _local(path, flag, "a folder name")
    if path.exists() and not path.is_dir():
        raise RequestError(f"{flag} {path} is an existing file, not a folder; choose a new "
                           f"folder name")
    if path.is_dir() and any(path.iterdir()):
        raise RequestError(f"{flag} {path} is a folder that already has files; choose a new or "
                           f"empty folder, or empty it first (frames of two runs would mix)")
    check_writable_parent(path, flag)
    return path


def extra_path(main, kind: str) -> pathlib.Path:
    """Where a request's extra output ``kind`` goes beside its main output ``main``:
    ``out.mp4`` → ``out.<kind>.npy``."""
    main = pathlib.Path(main)
    return main.with_name(f"{main.stem}.{kind}.npy")


def write_extras(main, outputs: dict, stage: Staging | None = None) -> list[pathlib.Path]:
    """Write each extra output (``{kind: array}``, beside the main output ``main``) whole, as a
    ``.npy`` array at :func:`extra_path`; returns the paths. ``stage``: the request's
    :class:`Staging` (renamed with its other outputs). (A family whose extra output has a
    file format of its own — audio — adds its writer here.)"""
    import io

    import numpy as np

    paths = []
    with staged(stage) as s:
        for kind, array in outputs.items():
            path = extra_path(main, kind)
            data = io.BytesIO()       # np.save's own file writes lose the os error of a full disk
            np.save(data, np.asarray(array))
            with open(s.file(path), "wb") as f:
                f.write(data.getbuffer())
            paths.append(path)
    return paths


__all__ = ["WRITE_ERRORS", "Staging", "WriteFailed", "atomic_file", "atomic_folder",
           "check_output_file", "check_output_folder", "check_writable_parent", "extra_path",
           "staged", "write_code", "write_extras"]
