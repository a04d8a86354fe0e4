"""One model served by several processes (hosts): ``ditax serve --model M
mesh.num_processes=N mesh.process_id=K mesh.coordinator_address=HOST:PORT``, the same command
on every process but for ``K``.

Process 0 is the leader: it owns the job store, serves HTTP and decides each turn of the
worker (:mod:`ditax.serve.rows`). The others are followers: no store, no port; each loads the
same model onto the same global mesh (the mesh spans every process's devices, so a program on
it runs only when every process runs it) and applies the leader's turns to its own batch, so
that every process runs the same jax programs in the same order. Only the leader writes
outputs.

A turn is a list of operations, JSON: ``("add", id, request)``, ``("drop", id)``,
``("step",)`` (the continuous batch, :meth:`~ditax.serve.rows.Rows.apply`), ``("batch",
[requests])`` (a lock-step batch, :meth:`~ditax.serve.worker.Worker.run_jobs`; where the
worker's class says ``SHARES_STEPS``, one ``("next",)`` or ``("halt",)`` follows each of its
steps), ``("warm", [requests])`` (the leader's worker,
:func:`~ditax.serve.group_follow.leader_worker`: ``--warm``) and
``("stop",)``. The leader applies the turn as the followers read it (the JSON round trip), so
no process sees other values. A program on a mesh of several processes includes more
collectives than its own: ``jax.device_put`` of a host value checks it against every
process's (an all-gather), so nothing may put arrays on the mesh from threads whose order
differs per process (:func:`~ditax.serve.group_follow.warm_in_order`). Joining the group:
:mod:`ditax.serve.group_start`; what a follower runs: :mod:`ditax.serve.group_follow`.

Transport: jax's distributed key-value store (the coordination service that
``jax.distributed.initialize`` starts in process 0; ``jax._src.distributed.global_state.client``,
which ``jax.experimental.multihost_utils`` and orbax use too). Turn ``n`` is one value,
``ditax/serve/turn/n`` (any size: a request may hold base64 images); each follower counts
itself in ``ditax/serve/read/n`` after reading it and the last one deletes both. Not a
collective (``multihost_utils.broadcast_one_to_all``): a server's followers may wait for a job
for hours, which a collective would not survive (gloo / NCCL time out), and each payload size
would compile a program of its own.

At start the processes agree (:meth:`Group.agree`): the leader publishes its settings (the
model folder's files, the overrides, the LoRAs, ``--max-batch`` and ``--batching``); a follower
started with another model or other overrides says so in one line and exits 2, and so does
the leader, naming the follower. A follower takes ``--max-batch`` / ``--batching`` from the
leader and ignores ``--db``, ``--port`` and the other HTTP flags.

Failure: each follower writes a heartbeat key every second or so; the leader's watchdog thread
counts a follower silent for ``timeout`` seconds (``--process-timeout``) as lost: ``/health``
says so (``"process_lost"``; 503 once the worker has stopped), the worker stops, the running
jobs go back to the queue, and after :data:`LOST_GRACE` seconds the leader exits 1 with one
line — whatever its worker thread is doing (a collective whose peer died may never return,
or fail: a job fails only after every follower has been heard from since,
:class:`SettledStore`). A supervisor restarts the group; its jobs stay in the store. The
leader's death ends every follower at once: jax's coordination service lives in the leader,
and jax's client terminates the process that loses it (its own message, exit 134). jax's own
heartbeat timeout is set to three times ``timeout``, a backstop: jax ends a process whose
peer stopped beating with a fatal log and offers no hook (a Python ``missed_heartbeat_callback``
crashes in this jax), hence the group's own heartbeats for the one-line message.

Stop: a signal to the leader drains as for one process, then the leader sends ``("stop",)``
and every process exits 0 (jax's shutdown barrier sees all of them). A signal to a follower
asks the leader to stop the group the same way (:meth:`Group.ask_stop`); a second one leaves at
once (exit 1; the leader then finds it lost).
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time
from collections.abc import Callable

from ditax.errors import ConfigError, DitaxError
from ditax.serve.group_follow import Following

#: seconds a follower may be silent before the leader counts it lost (``--process-timeout``)
TIMEOUT = 15.0
#: seconds the leader answers ``/health`` with the lost process before it exits
LOST_GRACE = 1.0
NS = "ditax/serve"
#: settings every process must share (the followers adopt ``ADOPTED``; the rest must match)
ADOPTED = ("max_batch", "batching")


class Group(Following):
    """This process's side of a group of ``processes`` (module docstring); ``client``: jax's
    distributed client (default: the one ``jax.distributed.initialize`` made)."""

    def __init__(self, process_id: int, processes: int, timeout: float = TIMEOUT, client=None):
        if client is None:
            from jax._src.distributed import global_state

            client = global_state.client
        self.client, self.id, self.processes, self.timeout = client, process_id, processes, timeout
        self.turn = 0                      # the next turn to share (leader) or read (follower)
        self.lost: str | None = None       # the leader: which process was lost, and how
        self.stopped = False               # ("stop",) shared or received: no watch any more
        self.done = threading.Event()      # ends the watchdog
        self.thread: threading.Thread | None = None
        self.stop_asked = 0                # a follower's signals (ask_stop)
        self.theirs: dict = {}             # the leader's settings (agree; a follower adopts some)
        # the leader's: what a lost follower does (message -> None; then the process exits 1)
        # and what a follower's stop request does (the server's first signal)
        self.on_lost: Callable[[str], None] | None = None
        self.on_stop: Callable[[], None] | None = None
        # set when this process ends by an error: its status, at once (at_exit)
        self.exit_code: int | None = None
        atexit.register(self.at_exit)

    @property
    def leader(self) -> bool:
        return self.id == 0

    def name(self, k: int | None = None) -> str:
        k = self.id if k is None else k
        return f"process {k} of {self.processes}" + (" (the leader)" if k == 0 else "")

    def health(self) -> dict:
        """``/health``'s part: the processes, and the one lost (None while all answer)."""
        return {"processes": self.processes, "process_lost": self.lost}

    # --- start
    def agree(self, settings: dict, wait: float = 600.0) -> dict:
        """The leader publishes ``settings`` (:func:`~ditax.serve.group_start.fingerprint`)
        and waits (at most ``wait`` seconds) for each follower's answer; a follower compares
        its own with the leader's. Another model or other overrides: :class:`ConfigError` on
        both sides (exit 2). Returns the leader's settings (a follower adopts
        :data:`ADOPTED`)."""
        key = f"{NS}/settings"
        if self.leader:
            self.theirs = settings
            self.client.key_value_set(key, json.dumps(settings))
            bad = []
            for k in range(1, self.processes):
                said = self.client.blocking_key_value_get(f"{NS}/hello/{k}", int(wait * 1000))
                if said:
                    bad.append(f"{self.name(k)}: {said}")
            if bad:
                time.sleep(LOST_GRACE)   # the followers say it and exit before this one ends
                raise ConfigError(f"the processes of this server differ — {'; '.join(bad)}; "
                                  f"start every process with the same --model files and "
                                  f"key=value overrides")
            return settings
        theirs = json.loads(self.client.blocking_key_value_get(key, int(wait * 1000)))
        differ = [f"{k} {settings.get(k)!r} here, {theirs.get(k)!r} on the leader"
                  for k in sorted(set(settings) | set(theirs))
                  if k not in ADOPTED and settings.get(k) != theirs.get(k)]
        words = ", ".join(differ).replace("model ", "model files ")
        self.client.key_value_set(f"{NS}/hello/{self.id}", words)
        if differ:
            raise ConfigError(f"{self.name()} differs from the leader: {words}; start every "
                              f"process with the same --model files and key=value overrides")
        self.theirs = theirs
        return theirs

    # --- the turns
    def share(self, ops: list) -> list:
        """The leader: hand turn ``ops`` to every follower; returns it as they read it."""
        payload = json.dumps(ops, separators=(",", ":")).encode()
        if self.lost is None:            # a lost group shares nothing (the leader is exiting)
            self.client.key_value_set_bytes(f"{NS}/turn/{self.turn}", payload)
        self.turn += 1
        if any(op[0] == "stop" for op in ops):
            self.stopped = True
        return json.loads(payload)

    def receive(self) -> list:
        """A follower: the next turn (waits as long as the leader has none)."""
        key = f"{NS}/turn/{self.turn}"
        while True:
            try:
                # short waits: a signal's handler runs between two
                payload = self.client.blocking_key_value_get_bytes(key, 1000)
                break
            except Exception as e:  # noqa: BLE001 — jax's error type: only a wait that ended
                if "DEADLINE_EXCEEDED" not in str(e):
                    raise
        if self.client.key_value_increment(f"{NS}/read/{self.turn}", 1) == self.processes - 1:
            self.client.key_value_delete(key)            # every follower has it
            self.client.key_value_delete(f"{NS}/read/{self.turn}")
        self.turn += 1
        ops = json.loads(payload)
        if any(op[0] == "stop" for op in ops):
            self.stopped = True
        return ops

    # --- health
    def watch(self) -> None:
        """Start the watchdog thread: a follower writes its heartbeat (and a signal's stop
        request); the leader reads them, calls :attr:`on_stop` when a follower asks for a stop,
        and on a lost follower calls :attr:`on_lost` with the message, then exits 1 after
        :data:`LOST_GRACE` seconds."""
        self.thread = threading.Thread(target=self.beat if not self.leader else self.guard,
                                       name="ditax-serve-group", daemon=True)
        self.thread.start()

    def period(self) -> float:
        return max(0.05, min(1.0, self.timeout / 5))

    def beat(self) -> None:
        n, asked = 0, 0
        while not self.done.wait(self.period()):
            n += 1
            self.client.key_value_set(f"{NS}/beat/{self.id}", str(n), allow_overwrite=True)
            if self.stop_asked > asked:
                asked = self.stop_asked
                self.client.key_value_set(f"{NS}/stop/{self.id}", "1", allow_overwrite=True)

    def guard(self) -> None:
        start = time.monotonic()
        seen = {k: (None, start) for k in range(1, self.processes)}
        stop_seen = False
        while not self.done.wait(self.period()):
            now = time.monotonic()
            for k, (value, at) in list(seen.items()):
                got = self.beat_of(k)
                if got is not None and got != value:
                    seen[k] = (got, now)
                elif now - at > self.timeout and not self.stopped:
                    return self.lose(k, f"no heartbeat for {self.timeout:g} s")
            if not stop_seen and self.on_stop is not None:
                asked = self.client.key_value_dir_get(f"{NS}/stop/")
                if asked:
                    stop_seen = True
                    who = sorted(int(key.rsplit("/", 1)[1]) for key, _ in asked)
                    print(f"{self.name(who[0])} was signalled: the group stops", flush=True)
                    self.on_stop()

    def lose(self, k: int, why: str) -> None:
        """Follower ``k`` is lost: :meth:`end`."""
        self.end(f"{self.name(k)} lost ({why})")

    def end(self, what: str) -> None:
        """The group cannot go on (``what``): say so in one line, let :attr:`on_lost` act
        (``/health``, the running jobs back to the queue), exit 1 after :data:`LOST_GRACE`."""
        self.lost = what
        line = (f"ditax serve: error: {what}: the group stops (exit 1); restart every "
                f"process — the store keeps the jobs, the running ones run again")
        print(line, file=sys.stderr, flush=True)
        try:
            if self.on_lost is not None:
                self.on_lost(self.lost)
        finally:
            time.sleep(LOST_GRACE)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)

    def settle(self) -> None:
        """The leader, before it fails a job: wait until each follower has written a heartbeat
        since the call (a value other than the one read at the call: written after it), at
        most ``timeout`` seconds and a beat. A step that failed because a process died (its
        collective broke) so ends the group here — the watchdog exits 1 and the job runs
        again after the restart — instead of failing the job."""
        if not self.leader or self.thread is None:
            return
        first = {k: self.beat_of(k) for k in range(1, self.processes)}
        while first and not self.done.is_set():
            if self.lost is None:
                first = {k: v for k, v in first.items() if self.beat_of(k) == v}
            time.sleep(self.period() / 4)       # lost: the watchdog is ending the process

    def beat_of(self, k: int) -> str | None:
        """Follower ``k``'s last heartbeat value (None before its first)."""
        try:
            return self.client.key_value_try_get(f"{NS}/beat/{k}")
        except Exception:  # noqa: BLE001 — NOT_FOUND: no beat yet
            return None

    def after_error(self, e: BaseException) -> None:
        """The leader, when a step (or the batch around it) raised ``e``: :meth:`settle`; then
        a failure that is not a request's own check (which every process meets alike) may
        have struck this process alone, so the processes may no longer run the same programs:
        the group ends (:meth:`end`). Returns for a check's failure (the jobs fail)."""
        self.settle()
        if self.leader and not isinstance(e, (DitaxError, ValueError)):
            self.end(f"a step failed on {self.name()} ({type(e).__name__}: "
                     f"{str(e).splitlines()[0] if str(e) else ''}), so the processes may be "
                     f"out of step")

    def ask_stop(self) -> None:
        """A follower's signal: ask the leader to stop the group (safe in a signal handler)."""
        self.stop_asked += 1

    def close(self) -> None:
        """The end of this process's part: the leader shares ``("stop",)`` unless its worker
        did (a server that ends before its worker started); the watchdog ends."""
        if self.leader and not self.stopped and self.lost is None:
            self.share([("stop",)])
        self.stopped = True
        self.done.set()

    def at_exit(self) -> None:
        """At the interpreter's exit (registered after jax's, so it runs first): a process
        that ends by an error (:attr:`exit_code`) exits at once with that status — jax's
        shutdown barrier would wait minutes for processes that are not coming."""
        if self.exit_code is not None:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(self.exit_code)


class SettledStore:
    """The leader worker's view of the job store in a group: a job fails only once every
    follower has been heard from since (:meth:`Group.settle`); the rest as ``store``."""

    def __init__(self, store, group: Group):
        self._store, self._group = store, group

    def finish(self, job_id: str, status: str, **kw):
        if status == "failed":
            self._group.settle()
        return self._store.finish(job_id, status, **kw)

    def __getattr__(self, name):
        return getattr(self._store, name)


__all__ = ["ADOPTED", "Group", "LOST_GRACE", "NS", "SettledStore", "TIMEOUT"]
