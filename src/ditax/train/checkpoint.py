"""Orbax checkpoints of the train state + data iterator state, async, keep-N, with fallback.

Layout: ``{output_dir}/checkpoints/{step}/`` with two items, ``state`` (params, optimiser
state, step, base PRNG key — sharded arrays, each process writes its shards) and ``data``
(JSON: the grain iterator state, which is identical on every process, see
:mod:`ditax.train.data`, plus the dataset it belongs to).

Orbax writes into a temporary folder and renames it when the save is complete, so an
interrupted save never looks like a checkpoint. :meth:`Checkpointer.restore_latest` still
guards against damaged finalised checkpoints: it tries the newest step first and, when that
fails to restore, says so and falls back to the previous one.
"""

from __future__ import annotations

import logging
import pathlib
from typing import Any, Callable

import orbax.checkpoint as ocp

from ditax.config import CheckpointConfig

log = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    """No usable checkpoint could be restored; the message lists what was tried."""


class Checkpointer:
    """Thin wrapper over ``ocp.CheckpointManager`` for the train state and data state."""

    def __init__(self, directory, cfg: CheckpointConfig, say: Callable[[str], None] = print):
        self.dir = pathlib.Path(directory).absolute()
        self.say = say
        opts = ocp.CheckpointManagerOptions(max_to_keep=cfg.keep,
                                            enable_async_checkpointing=cfg.async_save,
                                            create=True)
        self.mgr = ocp.CheckpointManager(self.dir, options=opts, item_names=("state", "data"))

    def steps(self) -> list[int]:
        return sorted(self.mgr.all_steps())

    def incomplete(self) -> list[str]:
        """Names of leftover temporary folders of saves that never finished."""
        if not self.dir.exists():
            return []
        return sorted(p.name for p in self.dir.iterdir() if "tmp" in p.name)

    def save(self, step: int, state: Any, data_state: dict, force: bool = True) -> None:
        """Start an (async) save of ``state`` and the JSON ``data_state`` at ``step``."""
        self.mgr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                    data=ocp.args.JsonSave(data_state)),
                      force=force)

    def wait(self) -> None:
        self.mgr.wait_until_finished()

    def restore_latest(self, abstract_state: Any):
        """``(step, state, data_state)`` of the newest restorable checkpoint, or None if none.

        A checkpoint that fails to restore (damaged, half-deleted, wrong shapes) is reported
        and skipped in favour of the previous one.
        """
        for name in self.incomplete():
            self.say(f"checkpoint: ignoring incomplete save {self.dir / name} "
                     f"(interrupted before it finished)")
        steps = self.steps()
        failures = []
        for step in reversed(steps):
            try:
                out = self.mgr.restore(step, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract_state),
                    data=ocp.args.JsonRestore()))
            except Exception as e:  # noqa: BLE001 - any failure means "unusable checkpoint"
                msg = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
                failures.append((step, msg))
                older = [s for s in steps if s < step]
                nxt = f"falling back to step {older[-1]}" if older else "no older checkpoint"
                moved = self._quarantine(step)
                self.say(f"checkpoint: step {step} in {self.dir} is incomplete or corrupted "
                         f"({msg}); moved it to {moved.name} for inspection; {nxt}")
                continue
            if failures:
                self.mgr.reload()   # the quarantined steps are gone from the manager's view
            return step, out["state"], out["data"]
        if failures:
            raise CheckpointError(
                f"no checkpoint in {self.dir} could be restored (tried steps "
                f"{[s for s, _ in failures]}); delete the folder to start over, or point "
                f"output_dir elsewhere")
        return None

    def _quarantine(self, step: int) -> pathlib.Path:
        """Rename a damaged step folder aside (nothing is deleted) so training can save that
        step again after falling back. Process 0 renames; all processes wait for it."""
        import jax

        src = self.dir / str(step)
        dst = self.dir / f"{step}.corrupt"
        n = 1
        while dst.exists():
            n += 1
            dst = self.dir / f"{step}.corrupt{n}"
        if jax.process_index() == 0 and src.exists():
            src.rename(dst)
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices(f"ditax_quarantine_{step}")
        return dst

    def close(self) -> None:
        self.mgr.wait_until_finished()
        self.mgr.close()
