"""Orbax checkpoints of the train state + data iterator state, async, keep-N, with fallback.

Layout: ``{output_dir}/checkpoints/{step}/`` with two items, ``state`` (params, optimiser
state, step, base PRNG key — sharded arrays, each process writes its shards) and ``data``
(JSON: the grain iterator state, which is identical on every process, see
:mod:`ditax.train.data`, plus the dataset it belongs to).

Orbax writes into a temporary folder and renames it when the save is complete, so an
interrupted save never looks like a checkpoint. :meth:`Checkpointer.restore_latest` still
guards against damaged finalised checkpoints: it tries the newest step first and, when that
fails to read, says so and falls back to the previous one; a checkpoint of another model
(other shapes or dtypes) is refused instead, with nothing renamed.
"""

from __future__ import annotations

import logging
import pathlib
from typing import Any, Callable

import orbax.checkpoint as ocp

from ditax.config import CheckpointConfig
from ditax.errors import DitaxError

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
        self.mgr = ocp.CheckpointManager(   # handlers named up front: metadata reads need them
            self.dir, options=opts, item_handlers={"state": ocp.StandardCheckpointHandler(),
                                                   "data": ocp.JsonCheckpointHandler()})

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

    def moved_aside(self) -> list[str]:
        """Names of step folders an earlier run moved aside as unreadable (``4.corrupt``)."""
        if not self.dir.exists():
            return []
        return sorted(p.name for p in self.dir.iterdir() if ".corrupt" in p.name)

    def restore_latest(self, abstract_state: Any):
        """``(step, state, data_state)`` of the newest restorable checkpoint, or None if none.

        Each checkpoint's stored shapes and dtypes are compared with ``abstract_state`` first:
        a checkpoint of another model is refused (:class:`~ditax.train.resume.ResumeMismatch`)
        with nothing renamed. A checkpoint that fails to read is skipped for the previous one,
        and moved aside (``{step}.corrupt``) only once an older one of the same run restored,
        which shows the failure is the file's and not the setup's; when none restores,
        nothing is moved and :class:`CheckpointError` lists what was tried. With no
        checkpoint left but moved-aside ones, it refuses to start the run over.
        """
        from ditax.train.resume import check_structure

        for name in self.incomplete():
            self.say(f"checkpoint: ignoring incomplete save {self.dir / name} "
                     f"(interrupted before it finished)")
        steps, aside = self.steps(), self.moved_aside()
        if not steps and aside:
            raise CheckpointError(
                f"{self.dir} holds no usable checkpoint, only ones an earlier run moved aside "
                f"as unreadable ({', '.join(aside)}); not starting over from step 0. Inspect "
                f"or delete them to start again, or choose a new output_dir")
        if aside:
            self.say(f"checkpoint: {self.dir} also holds moved-aside unreadable checkpoints "
                     f"({', '.join(aside)}); they are not used")
        failures = []
        for step in reversed(steps):
            older = [s for s in steps if s < step]
            nxt = f"falling back to step {older[-1]}" if older else "no older checkpoint"
            try:
                stored = self.mgr.item_metadata(step)["state"]
                check_structure(self.dir, step, getattr(stored, "tree", stored),
                                abstract_state)
                out = self.mgr.restore(step, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract_state),
                    data=ocp.args.JsonRestore()))
            except DitaxError:
                raise                   # another run's checkpoint: refused, nothing touched
            except Exception as e:  # noqa: BLE001 - any read failure: try the older one
                msg = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
                failures.append((step, msg))
                self.say(f"checkpoint: step {step} in {self.dir} is incomplete or corrupted "
                         f"({msg}); {nxt}")
                continue
            for bad, _ in failures:
                moved = self._quarantine(bad)
                self.say(f"checkpoint: step {bad} failed to read while step {step} restored: "
                         f"moved it to {moved.name} for inspection")
            if failures:
                self.mgr.reload()   # the quarantined steps are gone from the manager's view
            return step, out["state"], out["data"]
        if failures:
            raise CheckpointError(
                f"no checkpoint in {self.dir} could be restored (tried steps "
                f"{[s for s, _ in failures]}: {failures[0][1]}); nothing was moved or "
                f"deleted. If they are damaged, move them away to start over, or point "
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
