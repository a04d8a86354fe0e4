"""Writing media with the ffmpeg that imageio-ffmpeg ships, its failure never taken for success.

imageio-ffmpeg's writer neither reads ffmpeg's exit status nor its error lines: an mp4 whose
trailer could not be written (``Error writing trailer: No space left on device``) was
reported written. :func:`write` runs ffmpeg itself, at ``-v error`` (every line it prints is
an error), its standard error kept in a temporary file (no pipe to fill up), and the input
fed through its standard input: the write failed when ffmpeg exits non-zero, or prints an
error line, or stops reading its input (a broken pipe: its error line says why). That is
:class:`~ditax.io.outputs.WriteFailed` naming the file, the os error ffmpeg met (the disk
full, a file-size limit, no permission) and ffmpeg's own line. ``IMAGEIO_FFMPEG_EXE`` picks
another ffmpeg, as for imageio.

ffmpeg runs without the malloc replacement the calling process may preload (``LD_PRELOAD``
of tcmalloc, jemalloc or mimalloc, as ``make test`` and many TPU hosts do): under tcmalloc
the ffmpeg that imageio-ffmpeg ships encodes the same frames to different H.264 bytes about
one time in twenty-five (its buffers' alignment varies run to run; seen with x264 core 165),
so ``ditax serve`` and ``ditax generate`` could write different videos of one request.
:func:`child_env` is the environment it gets.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import warnings

from ditax.io.outputs import WriteFailed, write_code

# the words of ffmpeg's error lines (at -v error nothing else should be printed; a line
# without them is shown as a note and not taken for a failure)
_ERROR = re.compile(r"error|fail|could not|cannot|can't|invalid|denied|no space|too large|"
                    r"quota|read-only|unable", re.IGNORECASE)


#: the allocators dropped from a preload for ffmpeg (module docstring)
_ALLOCATORS = re.compile(r"tcmalloc|jemalloc|mimalloc")


def child_env(environ=None) -> dict:
    """``environ`` (default ``os.environ``) for an ffmpeg child: ``LD_PRELOAD`` without the
    malloc replacements (:data:`_ALLOCATORS`), the rest kept; unset when nothing is left."""
    env = dict(os.environ if environ is None else environ)
    kept = [p for p in re.split(r"[:\s]+", env.get("LD_PRELOAD", "")) if p
            and not _ALLOCATORS.search(os.path.basename(p))]
    env.pop("LD_PRELOAD", None)
    if kept:
        env["LD_PRELOAD"] = ":".join(kept)
    return env


def exe() -> str:
    """The ffmpeg executable (imageio-ffmpeg's, or ``$IMAGEIO_FFMPEG_EXE``)."""
    import imageio_ffmpeg

    return imageio_ffmpeg.get_ffmpeg_exe()


def check_available() -> str:
    """The ffmpeg an mp4 write will run (:func:`exe`), or a one-line
    :class:`~ditax.errors.RequestError` naming why there is none and the fix — before any
    work, where a missing ffmpeg used to fail each video only at its write, after the model
    had made it (a server without one lost every job)."""
    from ditax.errors import RequestError

    try:
        path = exe()
    except ImportError:
        raise RequestError("writing an mp4 needs imageio-ffmpeg, which is not "
                           "installed here: pip install imageio-ffmpeg (or set "
                           "IMAGEIO_FFMPEG_EXE to an ffmpeg once it is)") from None
    except RuntimeError:
        raise RequestError("writing an mp4 needs ffmpeg and none was found "
                           "(imageio-ffmpeg's own binary is missing and there is none on "
                           "PATH): reinstall imageio-ffmpeg, or set "
                           "IMAGEIO_FFMPEG_EXE=/path/to/ffmpeg") from None
    found = (shutil.which(path) if os.sep not in path
             else path if os.path.isfile(path) and os.access(path, os.X_OK) else None)
    if found is None:
        raise RequestError(f"writing an mp4 runs {path!r}"
                           f"{' (IMAGEIO_FFMPEG_EXE)' if os.getenv('IMAGEIO_FFMPEG_EXE') else ''}"
                           ", which is not an executable file; point IMAGEIO_FFMPEG_EXE at "
                           "an ffmpeg, or unset it to use imageio-ffmpeg's own")
    return found


@contextlib.contextmanager
def quiet_fork():
    """imageio-ffmpeg and this module start ffmpeg with subprocess (fork + immediate exec),
    which Python flags as unsafe in a multithreaded (JAX) process. The child only execs
    ffmpeg, so the warning does not apply; it is silenced here and only here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called",
                                category=RuntimeWarning)
        yield


def problem(lines: list[str]) -> str:
    """The line of ffmpeg's errors that says what went wrong: the first naming an os error
    (``... No space left on device``), else the first error line, else the last; without
    the ``[out#0/mp4 @ 0x...]`` prefix."""
    text = (next((ln for ln in lines if write_code(ln) is not None), None)
            or next((ln for ln in lines if _ERROR.search(ln)), None)
            or (lines[-1] if lines else "no message"))
    text = text.strip()
    if text.startswith("[") and "] " in text:
        text = text.split("] ", 1)[1]
    return text


def write(args: list[str], target, chunks=None) -> None:
    """Run ``ffmpeg -v error -y ARGS``, which write the file ``target`` (the temporary path a
    :func:`~ditax.io.outputs.staged` write gave), feeding it ``chunks`` (bytes-like objects:
    raw frames, samples) on its standard input; :class:`~ditax.io.outputs.WriteFailed`
    naming ``target`` unless it exits 0 without an error line (module docstring)."""
    cmd = [exe(), "-hide_banner", "-nostats", "-v", "error", "-y", *args]
    with tempfile.TemporaryFile() as err:
        with quiet_fork():
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE if chunks is not None else
                                    subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                    env=child_env())
        try:
            for chunk in chunks or ():
                proc.stdin.write(chunk)
        except BrokenPipeError:
            pass                    # ffmpeg stopped reading: its exit and error say why
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        finally:
            if proc.stdin is not None:
                with contextlib.suppress(BrokenPipeError):
                    proc.stdin.close()
        status = proc.wait()
        err.seek(0)
        lines = [ln for ln in err.read().decode(errors="replace").splitlines() if ln.strip()]
    errors = [ln for ln in lines if _ERROR.search(ln)]
    if status != 0 or errors:
        line = problem(lines)
        code = write_code("\n".join(lines))
        raise WriteFailed(target, code, f"ffmpeg: {line}" +
                          (f" (exit status {status})" if status else ""))
    for ln in lines:                # notes at the error level that name no error
        print(f"ffmpeg: {ln}", file=sys.stderr)


__all__ = ["child_env", "exe", "problem", "quiet_fork", "write"]
