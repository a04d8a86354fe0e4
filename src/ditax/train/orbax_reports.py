"""Orbax's own reports of a checkpoint save, held back while the save is in flight and dropped
when it fails (:class:`HeldBack`): the :class:`~ditax.train.checkpoint.CheckpointSaveError`
says in one line what they say in hundreds of log lines and tracebacks from orbax's writer
threads.
"""

from __future__ import annotations

import logging
import pathlib
import sys
import threading


class HeldBack(logging.Filter):
    """Orbax's reports while a save is in flight: its warnings and errors (the ``absl``
    logger, from orbax's own files), asyncio's "Task exception was never retrieved" of its
    write tasks, and the "Event loop is closed" reports (``sys.unraisablehook``) of its writes
    that end after another failed. They are held back, then passed on as they were when the
    save completes (:meth:`release`), or dropped when it fails (:meth:`drop`): the
    :class:`CheckpointSaveError` says in one line what they say in hundreds. Anything else
    passes untouched. Installed by the first save, removed by :meth:`uninstall` — except
    after a failed save: the failed writes' tasks are reported when they are garbage collected
    (at exit, once the error is printed), so the filter stays for those (asyncio reports
    naming the failed save's folder, and "Event loop is closed") and nothing else."""

    LOGGERS = ("absl", "asyncio")

    def __init__(self, folder: pathlib.Path):
        super().__init__()
        self.folder = str(folder)
        self.lock = threading.Lock()
        self.held: list = []
        self.installed = self.holding = self.failed = False
        self._prev_hook = None

    @staticmethod
    def _orbax_record(record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return False
        if record.name == "asyncio":
            return "orbax" in record.getMessage()
        return "orbax" in pathlib.PurePath(record.pathname).parts

    def filter(self, record) -> bool:
        if not self._orbax_record(record):
            return True
        with self.lock:
            if self.holding:
                self.held.append(record)
                return False
        return not (self.failed and record.name == "asyncio"
                    and self.folder in record.getMessage())

    def _unraisable(self, u) -> None:
        if (self.installed and (self.holding or self.failed)
                and isinstance(u.exc_value, RuntimeError)
                and str(u.exc_value) == "Event loop is closed"):
            with self.lock:
                if self.holding:
                    self.held.append(u)
        else:
            self._prev_hook(u)

    def hold(self) -> None:
        """Start holding back (from a save's start to its end)."""
        if not self.installed:
            for name in self.LOGGERS:
                logging.getLogger(name).addFilter(self)
            self._prev_hook, sys.unraisablehook = sys.unraisablehook, self._unraisable
            self.installed = True
        self.holding = True

    def release(self) -> None:
        """The save completed: pass on what was held back, as it would have gone."""
        with self.lock:
            held, self.held, self.holding = self.held, [], False
        for item in held:
            if isinstance(item, logging.LogRecord):
                logging.getLogger(item.name).callHandlers(item)
            else:
                self._prev_hook(item)

    def drop(self) -> None:
        """The save failed: forget what was held back (the error says it), and keep dropping
        the failed writes' late reports."""
        with self.lock:
            self.held, self.holding, self.failed = [], False, True

    def uninstall(self) -> None:
        """Stop holding back (anything still held is passed on); after a failure, only the
        failed writes' late reports are dropped from here on."""
        if not self.installed:
            return
        self.release()
        if self.failed:
            return
        for name in self.LOGGERS:
            logging.getLogger(name).removeFilter(self)
        if sys.unraisablehook == self._unraisable:
            sys.unraisablehook = self._prev_hook
        # else another hook was put over ours since: ours stays in its chain, passing all on
        self.installed = False


__all__ = ["HeldBack"]
