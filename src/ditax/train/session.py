"""What every training run loop does around its steps (the transformer's and the VAE's).

:class:`RunSession` is a context manager over one run of steps ``start → total``:

- SIGTERM (a scheduler's pre-emption) sets a flag; the step in flight finishes, then
  :meth:`RunSession.end_step` saves a checkpoint and tells the loop to stop;
- a non-finite loss raises :class:`NonFiniteLoss` before anything is saved, so the newest
  checkpoint stays the last good one (:meth:`RunSession.check_loss`);
- the progress bar (tqdm), the metrics writer and the checkpointer are closed on the way out,
  whatever happened, and the previous SIGTERM handler is put back.
"""

from __future__ import annotations

import math
import signal


class NonFiniteLoss(RuntimeError):
    """The loss became NaN/inf; the message names the step and the checkpoint kept."""


class RunSession:
    """``with RunSession(ckpt, writer, total=..., start=..., ...) as run:`` around a loop of
    steps; ``run.interrupted`` is true once SIGTERM arrived."""

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
        self._prev = None
        self._bar = None

    def __enter__(self) -> "RunSession":
        def on_term(signum, frame):     # finish the step in flight, then save and return
            self.signal = signum

        try:
            self._prev = signal.signal(signal.SIGTERM, on_term)
        except ValueError:              # not the main thread: no handler
            self._prev = None
        if self.progress:
            from tqdm import tqdm

            self._bar = tqdm(total=self.total, initial=self.start, desc=self.desc, unit="step",
                             dynamic_ncols=True)
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.close()
        self.writer.close()
        self.ckpt.close()
        if self._prev is not None:
            signal.signal(signal.SIGTERM, self._prev)

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
            f"{self.ckpt.dir}. {fix}")

    def tick(self, **postfix) -> None:
        """One step done: advance the bar, showing ``postfix``."""
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix(**postfix)

    def end_step(self, step: int, state, meta: dict) -> bool:
        """Checkpoint ``state`` (with ``meta``) when it is due (every ``every`` steps, the last
        step, or SIGTERM arrived); returns True when the loop must stop (SIGTERM)."""
        stop = self.signal is not None
        if step % self.every == 0 or step == self.total or stop:
            self.ckpt.save(step, state, meta)
        if stop:
            self.ckpt.wait()
            self.say(f"{self.prefix}received signal {self.signal}: saved checkpoint step {step} "
                     f"in {self.ckpt.dir}; rerun the same command to resume")
            self.interrupted = True
        return stop


__all__ = ["RunSession", "NonFiniteLoss"]
