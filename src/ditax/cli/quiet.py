"""A command's stderr without libtpu's probing noise on a machine with no TPU.

With libtpu installed (``make test`` installs it for the deviceless TPU compiles) and no TPU
attached, JAX's backend start loads the TPU plugin, which asks for the chip and prints five
lines from C++ ("could not determine TPU accelerator type", "Logging before InitGoogle()",
"E0000 ... unexpected worker hostname ...", a source trace) before JAX falls back to the CPU.
Nothing is wrong, but every command started with them.

:func:`quiet_libtpu` runs a command with file descriptor 2 read through a pipe: what arrives
is passed on as it comes (progress bars and status lines included), except whole lines of
that probing. Where the backends start, whether JAX starts at all, the platform it chooses
(a TPU when there is one) and ``jax.distributed`` (which must start before any backend) are
untouched: nothing here starts JAX.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading

#: lines libtpu prints while probing for a chip that is not there
PROBING = re.compile(
    r"(could not determine TPU|Failed to find host bounds|Logging before InitGoogle|"
    r"TPU_WORKER_HOSTNAMES|unexpected worker hostname|=== Source Location Trace|"
    r"libtpu_init_utils|TPU_ACCELERATOR_TYPE|libtpu\.so may not properly initialize)")


def filter_probing(text: str) -> str:
    """``text`` without libtpu's chip-probing lines (a last line without its newline is kept
    unless it is one)."""
    return "".join(line for line in text.splitlines(keepends=True) if not PROBING.search(line))


def _pump(read_fd: int, write_fd: int) -> None:
    """Copy ``read_fd`` to ``write_fd`` as it arrives, dropping whole probing lines; closes
    both at the pipe's end (``write_fd`` is the pump's own copy of the real stderr)."""
    while True:
        try:
            chunk = os.read(read_fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        text = chunk.decode("utf-8", "replace")
        kept = filter_probing(text) if PROBING.search(text) else text
        if kept:
            try:
                os.write(write_fd, kept.encode("utf-8", "replace") if kept is not text
                         else chunk)
            except OSError:
                break
    os.close(read_fd)
    os.close(write_fd)


@contextlib.contextmanager
def quiet_libtpu():
    """Inside the block, fd 2 goes through a filter that drops libtpu's probing lines
    (:data:`PROBING`); restored, and the filter drained, on exit."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
        read_fd, write_fd = os.pipe()
    except OSError:      # no fd 2 to filter (a detached process): run as is
        yield
        return
    os.dup2(write_fd, 2)
    os.close(write_fd)
    pump = threading.Thread(target=_pump, args=(read_fd, os.dup(saved)), daemon=True,
                            name="ditax-stderr")
    pump.start()
    try:
        yield
    finally:
        try:
            sys.stderr.flush()
        finally:
            os.dup2(saved, 2)      # closes the pipe's last writer here: the pump sees its end
            pump.join(timeout=5)
            os.close(saved)


__all__ = ["quiet_libtpu", "filter_probing", "PROBING"]
