"""A status line on stderr for the phases a progress bar does not cover (loading, compiling …).

Listens to :mod:`ditax.phases`. On a terminal it is a spinner with the seconds so far, rewritten
in place and cleared when the phase ends (the denoise / train bars take the line next); into a
file or pipe it is one line per phase start (``ditax: compiling …``), so logs show where time
went without carriage-return noise. ``--no-progress`` turns it off with the bars.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time

from ditax.phases import listening

LABELS = {"load": "loading the model", "text": "encoding the prompt",
          "image": "encoding the image", "compile": "compiling", "decode": "decoding",
          "bench": "benchmarking (compile + timed runs)", "preprocess": "preprocessing"}
FRAMES = "|/-\\"


class StatusLine:
    """The listener: one phase shown at a time (the innermost that has a label)."""

    def __init__(self, stream=None, interval: float = 0.25):
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval = interval
        self._shown: str | None = None
        self._printed: str | None = None   # the last line written (not a terminal)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __call__(self, name: str, started: bool) -> None:
        if name not in LABELS:
            return
        if started:
            self._end()
            self._start(name)
        elif name == self._shown:
            self._end()

    def _start(self, name: str) -> None:
        self._shown = name
        if not self.tty:
            if name != self._printed:     # two programs compiled in a row: one line
                self.stream.write(f"ditax: {LABELS[name]} ...\n")
                self.stream.flush()
            self._printed = name
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._spin, args=(LABELS[name],), daemon=True)
        self._thread.start()

    def _spin(self, label: str) -> None:
        t0, i = time.perf_counter(), 0
        while not self._stop.is_set():
            self.stream.write(f"\r{FRAMES[i % len(FRAMES)]} {label} "
                              f"{time.perf_counter() - t0:.0f}s")
            self.stream.flush()
            i += 1
            self._stop.wait(self.interval)
        self.stream.write("\r\033[K")
        self.stream.flush()

    def _end(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        self._shown = None


@contextlib.contextmanager
def status_line(enabled: bool = True, stream=None):
    """Inside, phases with a label show on ``stream`` (stderr) unless ``enabled`` is False."""
    if not enabled:
        yield None
        return
    line = StatusLine(stream)
    with listening(line):
        try:
            yield line
        finally:
            line._end()


__all__ = ["LABELS", "StatusLine", "status_line"]
