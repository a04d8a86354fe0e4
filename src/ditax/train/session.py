"""What every training run loop does around its steps (the transformer's and the VAE's).

:class:`RunSession` is a context manager over one run of steps ``start → total``:

- SIGTERM (a scheduler's pre-emption) and SIGINT (Ctrl-C) set a flag; the step in flight
  finishes, then :meth:`RunSession.end_step` saves a checkpoint, says which step the next run
  resumes from, and tells the loop to stop. A second Ctrl-C stops at once, without saving;
- a non-finite loss raises :class:`NonFiniteLoss` before anything is saved, so the newest
  checkpoint stays the last good one (:meth:`RunSession.check_loss`);
- the progress bar (tqdm), the metrics writer and the checkpointer are closed on the way out,
  whatever happened, and the previous signal handlers are put back.
"""

from __future__ import annotations

import math
import signal

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class NonFiniteLoss(RuntimeError):
    """The loss became NaN/inf; the message names the step and the checkpoint kept."""


class RunSession:
    """``with RunSession(ckpt, writer, total=..., start=..., ...) as run:`` around a loop of
    steps; ``run.interrupted`` is true once SIGTERM or SIGINT arrived and the checkpoint was
    saved (``run.signal`` is which)."""

    def __init__(self, ckpt, writer, *, total: int, start: int, desc: str, every: int,
                 progress: bool = True, say=print, prefix: str = ""):
        self.ckpt = ckpt
        self.writer = writer
        self.total = total
        self.start = start
        self.desc = desc
        self.every = every
        self.progress = progress
        self.say = say
        self.prefix = prefix
        self.signal = None
        self.interrupted = False
        self._prev: dict = {}
        self._bar = None

    def __enter__(self) -> "RunSession":
        def on_signal(signum, frame):   # finish the step in flight, then save and return
            self.signal = signum
            if signum == signal.SIGINT:     # a second Ctrl-C: stop now (KeyboardInterrupt)
                signal.signal(signal.SIGINT, signal.default_int_handler)
            self.say(f"{self.prefix}received {signal.Signals(signum).name}: finishing the "
                     f"step in flight, then saving a checkpoint"
                     + (" (Ctrl-C again stops without saving)"
                        if signum == signal.SIGINT else ""))

        self._prev = {}
        for sig in SIGNALS:
            try:
                self._prev[sig] = signal.signal(sig, on_signal)
            except ValueError:          # not the main thread: no handler
                pass
        if self.progress:
            from tqdm import tqdm

            self._bar = tqdm(total=self.total, initial=self.start, desc=self.desc, unit="step",
                             dynamic_ncols=True)
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self._bar is not None:
                self._bar.close()
            self.writer.close()
            self.ckpt.close()       # may raise: the last save failed (CheckpointSaveError)
        finally:
            for sig, prev in self._prev.items():
                signal.signal(sig, prev)

    def check_loss(self, loss: float, step: int, fix: str) -> None:
        """Raise :class:`NonFiniteLoss` (naming the step, the checkpoint kept and ``fix``)
        when ``loss`` is NaN or inf."""
        if math.isfinite(loss):
            return
        self.ckpt.wait()
        kept = self.ckpt.steps()
        raise NonFiniteLoss(
            f"{self.prefix}loss is {loss} at step {step}; stopping without saving. The last "
            f"good checkpoint is {'step ' + str(kept[-1]) if kept else 'none'} in "
            f"{self.ckpt.where}. {fix}")

    def tick(self, **postfix) -> None:
        """One step done: advance the bar, showing ``postfix``."""
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix(**postfix)

    def end_step(self, step: int, state, meta: dict) -> bool:
        """Checkpoint ``state`` (with ``meta``) when it is due (every ``every`` steps, the last
        step, or a signal arrived); returns True when the loop must stop (a signal)."""
        stop = self.signal is not None
        if step % self.every == 0 or step == self.total or stop:
            self.ckpt.save(step, state, meta)
        if stop:
            self.ckpt.wait()
            self.say(f"{self.prefix}stopped by {signal.Signals(self.signal).name}: saved "
                     f"checkpoint step {step} in {self.ckpt.where}; the same command resumes "
                     f"from step {step}")
            self.interrupted = True
        return stop


__all__ = ["RunSession", "NonFiniteLoss"]
