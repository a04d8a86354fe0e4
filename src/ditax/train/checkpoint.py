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

A save that cannot be written (the disk or quota full, a file past ``ulimit -f``, or any other
write error) raises :class:`CheckpointSaveError` where it surfaces — saves are async, so at
:meth:`Checkpointer.wait`, the next :meth:`~Checkpointer.save` or :meth:`~Checkpointer.close`
— with one line naming the folder, the space a checkpoint needs, what is free and the save's
partial folder to delete; the newest finished checkpoint stays as it was. Orbax's own reports of
the failure (hundreds of log lines and tracebacks from its writer threads) are held back while
a save is in flight (:class:`~ditax.train.orbax_reports.HeldBack`) and dropped when it
fails; the space check and its message: :mod:`ditax.train.checkpoint_space`.

A run whose ``output_dir`` is a URL passes ``sync`` (:class:`ditax.io.remote.runs.StepSync`):
orbax still writes the local (staging) folder, and each step it finishes is uploaded in a
background thread, ``commit_success.txt`` last; the steps are then the *committed* ones at the
URL (a half upload is reported and never restored from), older ones are downloaded when a
fallback needs them, and a moved-aside step is moved aside at the URL too. The next save waits
for the previous upload; :meth:`Checkpointer.wait` and :meth:`~Checkpointer.close` wait for it,
and an upload that fails is a :class:`CheckpointSaveError` naming the URL and the step the same
command resumes from.
"""

from __future__ import annotations

import contextlib
import logging
import pathlib
import threading
import warnings
from typing import Any, Callable

import orbax.checkpoint as ocp

from ditax.config import CheckpointConfig
from ditax.errors import DitaxError
from ditax.train.checkpoint_read import finished_steps
from ditax.train.checkpoint_space import save_failure
from ditax.train.orbax_reports import HeldBack

log = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    """No usable checkpoint could be restored; the message lists what was tried."""


class CheckpointSaveError(CheckpointError):
    """A checkpoint could not be written; the message names the folder, the space it needs and
    the newest finished checkpoint (left as it was), from which the same command resumes."""


# orbax writes a replicated array "replica-parallel": each replica slices out its part of the
# array on its device and writes that, one small slice program compiled per shape and device
# (on 8 devices, ~40 compiles the first save of a small model, the most of its cost there).
# Below this many bytes a slice, the array is written whole by one replica, as orbax does for
# every array on GPUs: the values and the restored state are the same (only the chunking of
# the stored array differs); arrays whose slices are bigger are still written replica-parallel.
MIN_REPLICA_SLICE_BYTES = 1 << 20


def _state_handler() -> ocp.StandardCheckpointHandler:
    """orbax's ``StandardCheckpointHandler`` (its args, format and reader) whose jax.Array
    writer slices only arrays whose replica slices are at least
    :data:`MIN_REPLICA_SLICE_BYTES` (a subclass would not match ``StandardSave`` in orbax's
    handler registry, so the instance's tree handler is swapped)."""
    import jax
    from orbax.checkpoint._src.metadata import array_metadata_store

    types = ocp.type_handlers
    registry = types.create_type_handler_registry(
        *((t, types.get_type_handler(t)) for t in types.supported_types()))
    registry.add(jax.Array, types.ArrayHandler(
        array_metadata_store=array_metadata_store.Store(),      # as orbax's default one
        min_slice_bytes_for_replica_parallel=MIN_REPLICA_SLICE_BYTES),
        override=True, ignore_warnings=True)
    handler = ocp.StandardCheckpointHandler()
    handler._impl = ocp.PyTreeCheckpointHandler(type_handler_registry=registry)
    return handler


class Checkpointer:
    """Thin wrapper over ``ocp.CheckpointManager`` for the train state and data state."""

    def __init__(self, directory, cfg: CheckpointConfig, say: Callable[[str], None] = print,
                 sync=None):
        self.dir = pathlib.Path(directory).absolute()
        self.say = say
        self.sync = sync            # a URL's StepSync: the local folder is its staging copy
        self.where = sync.url if sync is not None else self.dir     # for messages
        if sync is not None:
            sync.prepare(say)
        self._upload = None         # the upload in flight (a Future)
        self._abort = threading.Event()
        self._pool = None
        opts = ocp.CheckpointManagerOptions(max_to_keep=cfg.keep,
                                            enable_async_checkpointing=cfg.async_save,
                                            create=True)
        self.mgr = ocp.CheckpointManager(   # handlers named up front: metadata reads need them
            self.dir, options=opts, item_handlers={"state": _state_handler(),
                                                   "data": ocp.JsonCheckpointHandler()})
        self._in_flight: int | None = None   # the step of the save not yet known to be done
        self._state_bytes = 0                 # of the last state saved (the first save's need)
        self._failed = False
        self._held = HeldBack(self.dir)

    def steps(self) -> list[int]:
        """The finished steps (at a URL: the committed ones)."""
        if self.sync is not None:
            return self.sync.committed()
        return sorted(self.mgr.all_steps())

    def incomplete(self) -> list[str]:
        """Names of leftover temporary folders of saves that never finished (at a URL: step
        folders whose upload never committed)."""
        if self.sync is not None:
            return self.sync.partial()
        if not self.dir.exists():
            return []
        return sorted(p.name for p in self.dir.iterdir() if "tmp" in p.name)

    def save(self, step: int, state: Any, data_state: dict, force: bool = True) -> None:
        """Start an (async) save of ``state`` and the JSON ``data_state`` at ``step``; the
        previous save is finished first (its failure: :class:`CheckpointSaveError`)."""
        import jax

        self.wait()
        self._state_bytes = sum(getattr(x, "nbytes", 0) for x in jax.tree.leaves(state))
        self._held.hold()
        self._in_flight = step
        with self._save_failure():
            self.mgr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                        data=ocp.args.JsonSave(data_state)),
                          force=force)
        if self.sync is not None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = self._pool or ThreadPoolExecutor(1, thread_name_prefix="ditax-upload")
            self._abort.clear()
            self._upload = (step, self._pool.submit(self._push_step, step))

    def _push_step(self, step: int) -> None:
        """(upload thread) Once orbax has finished ``step`` locally (its folder renamed into
        place), upload it to the URL, commit file last."""
        import time

        while not (self.dir / str(step)).is_dir():
            if self._abort.is_set():
                return
            time.sleep(0.05)
        self.sync.upload(step)

    def wait(self) -> None:
        """Block until the save in flight is written; :class:`CheckpointSaveError` (one line)
        when it could not be."""
        if self._in_flight is None:      # after a failure, the manager's echo of it is not news
            with contextlib.suppress(Exception) if self._failed else contextlib.nullcontext():
                self.mgr.wait_until_finished()
            return
        with self._save_failure():
            self.mgr.wait_until_finished()
        self._in_flight = None
        self._held.release()
        self._join_upload()

    def _join_upload(self) -> None:
        """Wait for the upload in flight; its failure is a :class:`CheckpointSaveError`."""
        if self._upload is None:
            return
        (step, future), self._upload = self._upload, None
        try:
            future.result()
        except Exception as e:  # noqa: BLE001 - network, permissions: one line
            self._failed = True
            done = self.steps()
            resume = (f"it resumes from checkpoint step {done[-1]}, the newest committed there"
                      if done else "no checkpoint was committed there yet, so it starts from "
                      "step 0")
            first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
            raise CheckpointSaveError(
                f"checkpoint step {step} could not be uploaded to {self.where} "
                f"({type(e).__name__}: {first}); it is not committed there (no "
                f"commit_success.txt), so no run resumes from it. Fix that and rerun the same "
                f"command: {resume}") from e

    @contextlib.contextmanager
    def _save_failure(self):
        """Inside, a failure of the save in flight becomes :class:`CheckpointSaveError`."""
        try:
            yield
        except Exception as e:  # noqa: BLE001 - any write failure: said in one line
            self._failed = True
            self._abort.set()           # the upload waiting for this step: nothing to upload
            self._upload = None
            self._held.drop()
            step, self._in_flight = self._in_flight, None
            # orbax's writes of this save that never ran are reported, at interpreter exit, as
            # coroutines never awaited: the failure they belong to is this error's one line
            warnings.filterwarnings("ignore", message=r"coroutine .* was never awaited",
                                    category=RuntimeWarning)
            raise CheckpointSaveError(self._save_message(step, e)) from e

    def finished_steps(self) -> list[int]:
        """The steps whose checkpoint folder is finished (read from the folder itself, which
        stays right after a failed save, whatever the manager's view; at a URL: committed)."""
        if self.sync is not None:
            return self.sync.committed()
        return finished_steps(self.dir)

    def _save_message(self, step: int, e: BaseException) -> str:
        """The one line of a failed save of ``step`` (:func:`~ditax.train.checkpoint_space.
        save_failure`)."""
        return save_failure(self.dir, step, e, self.finished_steps(), self._state_bytes,
                            committed_at=self.where if self.sync is not None else None)

    def moved_aside(self) -> list[str]:
        """Names of step folders an earlier run moved aside as unreadable (``4.corrupt``)."""
        if self.sync is not None:
            return self.sync.aside()
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
            if self.sync is not None:
                self.say(f"checkpoint: ignoring incomplete upload {self.where}/{name} (no "
                         f"commit_success.txt: interrupted before it finished)")
            else:
                self.say(f"checkpoint: ignoring incomplete save {self.dir / name} "
                         f"(interrupted before it finished)")
        steps, aside = self.steps(), self.moved_aside()
        if not steps and aside:
            raise CheckpointError(
                f"{self.where} holds no usable checkpoint, only ones an earlier run moved aside "
                f"as unreadable ({', '.join(aside)}); not starting over from step 0. Inspect "
                f"or delete them to start again, or choose a new output_dir")
        if aside:
            self.say(f"checkpoint: {self.where} also holds moved-aside unreadable checkpoints "
                     f"({', '.join(aside)}); they are not used")
        failures = []
        for step in reversed(steps):
            older = [s for s in steps if s < step]
            nxt = f"falling back to step {older[-1]}" if older else "no older checkpoint"
            if self.sync is not None:
                self._fetch(step)
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
                self.say(f"checkpoint: step {step} in {self.where} is incomplete or corrupted "
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
                f"no checkpoint in {self.where} could be restored (tried steps "
                f"{[s for s, _ in failures]}: {failures[0][1]}); nothing was moved or "
                f"deleted. If they are damaged, move them away to start over, or point "
                f"output_dir elsewhere")
        return None

    def _fetch(self, step: int) -> None:
        """Bring committed ``step`` from the URL into the staging folder (a download that
        fails is not a damaged checkpoint: :class:`CheckpointError`, nothing moved)."""
        from ditax.io.remote.urls import RemoteError

        try:
            self.sync.fetch(step, self.say)
        except RemoteError as e:
            raise CheckpointError(f"{e}; nothing was moved or deleted, rerun the same command "
                                  f"to resume") from None
        self.mgr.reload()

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
        if self.sync is not None:
            self.sync.move_aside(step, dst.name)
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices(f"ditax_quarantine_{step}")
        return dst

    def close(self) -> None:
        """Finish the save in flight (:class:`CheckpointSaveError` if it fails) and close.
        After a failed save, the manager's own reports of it are not raised again."""
        try:
            self.wait()
        finally:
            if self._pool is not None:
                self._abort.set()
                self._pool.shutdown(wait=True)
                self._pool = None
            try:
                self.mgr.close()
            except Exception:  # noqa: BLE001
                if not self._failed:
                    raise
            finally:
                self._held.uninstall()
