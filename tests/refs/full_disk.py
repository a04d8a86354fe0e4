"""Fakes of a disk that fills up, for the tests of ditax's writers (``WriteFailed``).

- :func:`fill_disk`: Python's ``open`` (``builtins.open`` and ``io.open``, which PIL, ``wave``,
  ``pathlib``, ``shutil`` and numpy files use) hands out, for the paths that hold ``match``
  (a writer's temporary ``.partial`` names), files whose writes fail with ``OSError(code)``
  once ``after`` bytes are written — the lowest write, as a full disk fails it.
- :func:`fake_ffmpeg`: an ``$IMAGEIO_FFMPEG_EXE`` for ffmpeg's ways of failing: ``trailer``
  (the mp4 cut short, ``Error writing trailer: No space left on device`` and exit status 0, as
  ffmpeg 4 reports it), ``exit1`` (the same line, exit status 1), ``midway`` (it stops reading
  its input and exits 1: the writer's pipe breaks), ``dev_full`` (the real ffmpeg writing
  into ``/dev/full``: a real ENOSPC from the kernel), ``ulimit`` (the real ffmpeg under a
  4 KiB file-size limit: a real EFBIG).
- :func:`file_size_limit`: this process's writes past ``nbytes`` fail with EFBIG (the kernel's
  ``RLIMIT_FSIZE``, SIGXFSZ ignored): what C++ and Rust writers (ArrayRecord, safetensors)
  meet on a full disk, without root or a mount.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import io
import os
import resource
import signal
import stat
import sys


class _FullFile:
    """A real file whose writes fail with ``OSError(code)`` past ``left`` bytes (the bytes up
    to there are written, as on a disk that fills up); no ``fileno`` (so nothing writes
    around it with ``sendfile`` or C)."""

    def __init__(self, f, left: int, code: int, name: str):
        self._f, self._left, self._code, self._name = f, left, code, name

    def write(self, data):
        n = len(data) if isinstance(data, str) else memoryview(data).nbytes
        if n > self._left:
            if self._left:
                part = (data[:self._left] if isinstance(data, str)
                        else memoryview(data).cast("B")[:self._left])
                self._f.write(part)
            self._left = 0
            raise OSError(self._code, os.strerror(self._code), self._name)
        self._left -= n
        return self._f.write(data)

    def fileno(self):
        raise io.UnsupportedOperation("fileno")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()

    def __iter__(self):
        return iter(self._f)

    def __getattr__(self, name):
        return getattr(self._f, name)


def fill_disk(monkeypatch, after: int = 0, match: str = ".partial",
              code: int = errno.ENOSPC) -> None:
    """Files opened for writing at paths holding ``match`` fail with ``code`` past ``after``
    bytes (module docstring); undone with ``monkeypatch``."""
    real = builtins.open

    def fake_open(file, mode="r", *args, **kwargs):
        f = real(file, mode, *args, **kwargs)
        writes = any(c in mode for c in "wax+")
        if writes and isinstance(file, (str, os.PathLike)) and match in os.fspath(file):
            return _FullFile(f, after, code, os.fspath(file))
        return f

    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr(io, "open", fake_open)


_SCRIPTS = {
    "trailer": "import sys\nsys.stdin.buffer.read()\nopen(sys.argv[-1], 'wb').write(b'ftyp')\n"
               "print('[out#0/mp4 @ 0x5] Error writing trailer: No space left on device', "
               "file=sys.stderr)\nsys.exit(0)\n",
    "exit1": "import sys\nsys.stdin.buffer.read()\nopen(sys.argv[-1], 'wb').write(b'ftyp')\n"
             "print('[out#0/mp4 @ 0x5] Error writing trailer: No space left on device', "
             "file=sys.stderr)\nsys.exit(1)\n",
    "midway": "import sys\nsys.stdin.buffer.read(1000)\nopen(sys.argv[-1], 'wb').write(b'x')\n"
              "print('[vost#0:0 @ 0x5] Error submitting a packet to the muxer: No space left "
              "on device', file=sys.stderr)\nsys.exit(228)\n",
    "dev_full": "import os, sys\nos.execv(REAL, [REAL, *sys.argv[1:-1], '/dev/full'])\n",
}


def fake_ffmpeg(folder, kind: str) -> str:
    """The path of an executable that fails as ``kind`` (module docstring), in ``folder``."""
    import imageio_ffmpeg

    real = imageio_ffmpeg.get_ffmpeg_exe()
    path = os.path.join(folder, f"ffmpeg-{kind}")
    if kind == "ulimit":        # dash counts 512-byte blocks: 8 = 4 KiB
        text = f"#!/bin/sh\ntrap '' XFSZ\nulimit -f 8\nexec '{real}' \"$@\"\n"
    else:
        text = f"#!{sys.executable}\nREAL = {real!r}\n{_SCRIPTS[kind]}"
    with builtins.open(path, "w") as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
    return path


@contextlib.contextmanager
def file_size_limit(nbytes: int):
    """Inside, any file this process (or a child) grows past ``nbytes`` fails to grow with
    EFBIG (module docstring)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old)


__all__ = ["fake_ffmpeg", "file_size_limit", "fill_disk"]
