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
steps), ``("warm", [requests])`` (the leader's worker, :func:`leader_worker`: ``--warm``) and
``("stop",)``. The leader applies the turn as the followers read it (the JSON round trip), so
no process sees other values. A program on a mesh of several processes includes more
collectives than its own: ``jax.device_put`` of a host value checks it against every
process's (an all-gather), so nothing may put arrays on the mesh from threads whose order
differs per process (:func:`warm_in_order`).

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
import hashlib
import json
import os
import pathlib
import sys
import threading
import time
from collections.abc import Callable

from ditax.errors import ConfigError, DitaxError

#: seconds a follower may be silent before the leader counts it lost (``--process-timeout``)
TIMEOUT = 15.0
#: seconds the leader answers ``/health`` with the lost process before it exits
LOST_GRACE = 1.0
NS = "ditax/serve"
#: settings every process must share (the followers adopt ``ADOPTED``; the rest must match)
ADOPTED = ("max_batch", "batching")
SMALL_FILE = 1 << 16          # files up to this size count by their content (configs)


def is_group(mesh) -> bool:
    """Whether ``mesh`` (a :class:`~ditax.parallel.mesh.MeshConfig`) asks for several
    processes (``mesh.num_processes`` > 1, or a coordinator named)."""
    return ((mesh.num_processes or 1) > 1 or mesh.coordinator_address is not None
            or mesh.process_id is not None)


def check_mesh(mesh) -> None:
    """The multi-process keys of ``mesh``, checked before anything starts (one
    :class:`ConfigError` line each)."""
    n, k, address = mesh.num_processes, mesh.process_id, mesh.coordinator_address
    example = "mesh.num_processes=2 mesh.process_id=0 mesh.coordinator_address=HOST:PORT"
    if n is not None and n < 1:
        raise ConfigError(f"mesh.num_processes={n} must be >= 1 (the processes serving the "
                          f"model), e.g. {example}")
    if n is None:
        given = (f"mesh.coordinator_address={address}" if address is not None else
                 f"mesh.process_id={k}")
        raise ConfigError(f"{given} needs mesh.num_processes=N (the processes serving the "
                          f"model, >= 1), e.g. {example}")
    if address is None:
        raise ConfigError(f"mesh.num_processes={n} needs mesh.coordinator_address=HOST:PORT: "
                          f"process 0's address and a free port, the same on every process, "
                          f"e.g. {example}")
    host, _, port = str(address).rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"mesh.coordinator_address={address} is not HOST:PORT (process 0's "
                          f"address and a free port), e.g. mesh.coordinator_address="
                          f"10.0.0.1:4567")
    if k is None:
        raise ConfigError(f"mesh.num_processes={n} needs mesh.process_id=K on each process: 0 "
                          f"for the leader (it serves HTTP), 1 to {n - 1} for the others")
    if not 0 <= k < n:
        raise ConfigError(f"mesh.process_id={k} is out of range: with mesh.num_processes={n} "
                          f"it is 0 (the leader) to {n - 1}")


def start(mesh, timeout: float = TIMEOUT) -> "Group":
    """Join the group of ``mesh`` (checked by :func:`check_mesh`): jax's distributed runtime
    (gloo collectives on CPU; jax's heartbeat timeout three times ``timeout``), before any jax
    computation. Blocks until every process has joined (jax's initialization timeout, 300 s)."""
    import jax

    # a CPU group's collectives; chosen before initialize, ignored by GPU / TPU clients
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(mesh.coordinator_address, num_processes=mesh.num_processes,
                               process_id=mesh.process_id,
                               heartbeat_timeout_seconds=max(10, int(3 * timeout)))
    return Group(mesh.process_id, mesh.num_processes, timeout)


def fingerprint(root, overrides: list[str], loras: list[tuple[str, str]], **more) -> dict:
    """What every process of a group must share: the model folder's files (relative paths,
    sizes and the content of the small ones: another host's copy of the same folder has the
    same fingerprint), the overrides but the process's own keys, the LoRAs (names, sizes) and
    ``more`` (``max_batch``, ``batching``: the followers adopt the leader's)."""
    h = hashlib.sha256()
    root = pathlib.Path(root)
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(f for f in files if not f.startswith(".")):
            path = pathlib.Path(folder, name)
            size = path.stat().st_size
            h.update(f"{path.relative_to(root).as_posix()}\0{size}\0".encode())
            if size <= SMALL_FILE:
                h.update(path.read_bytes())
    own = ("mesh.process_id=", "mesh.coordinator_address=")
    return {"model": h.hexdigest()[:16],
            "overrides": [o for o in overrides if not o.startswith(own)],
            "loras": [[name, pathlib.Path(f).stat().st_size] for name, f in loras], **more}


class Group:
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
        """The leader publishes ``settings`` (:func:`fingerprint`) and waits (at most
        ``wait`` seconds) for each follower's answer; a follower compares its own with the
        leader's. Another model or other overrides: :class:`ConfigError` on both sides
        (exit 2). Returns the leader's settings (a follower adopts :data:`ADOPTED`)."""
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

    def follow(self, worker) -> None:
        """A follower's loop: apply the leader's turns to ``worker``'s pipeline (a
        :class:`~ditax.serve.worker.Worker` without store or group, its ``max_batch`` and
        ``mode`` the leader's) until ``("stop",)``; outputs are dropped (the leader writes
        them). A failure that is not a request's own check (which every process meets alike)
        ends the process: the group cannot stay in step past it."""
        from ditax.serve.batch import batchable
        from ditax.serve.rows import Rows

        batching = batchable(worker.pipe) and worker.mode != "off"
        with worker.context():
            rows = Rows(worker) if batching and worker.mode == "continuous" else None
            while True:
                ops = self.receive()
                pending: list = []
                for op in ops + [("end",)]:
                    if op[0] in ("add", "drop", "step"):
                        pending.append(op)
                        continue
                    if pending:
                        self.apply_rows(rows, pending)
                        pending = []
                    if op[0] == "warm":
                        self.warm(worker, op[1])
                    elif op[0] == "batch":
                        self.run_batch(worker, op[1], batching)
                    elif op[0] == "stop":
                        return

    @staticmethod
    def warm(worker, requests: list) -> None:
        """The leader's warm-up: a request's check failing is said and passed, as the leader
        does (:func:`ditax.serve.warm.warm_then_start`)."""
        try:
            warm_in_order(worker, requests)
        except (DitaxError, ValueError) as e:
            print(f"warm: failed ({type(e).__name__}: {e}); following without it", flush=True)

    def apply_rows(self, rows, ops: list) -> None:
        if rows is None:
            raise RuntimeError(f"the leader sent continuous-batch operations "
                               f"({', '.join(sorted({op[0] for op in ops}))}) to a follower "
                               f"without a continuous batch")
        got = rows.apply(ops)
        e = got["error"]
        if e is not None and not isinstance(e, (DitaxError, ValueError)):
            raise e

    def run_batch(self, worker, requests: list, batching: bool) -> None:
        """A lock-step batch, as :meth:`~ditax.serve.worker.Worker.run_jobs` runs it; where
        the leader's worker shares one ``("next",)`` / ``("halt",)`` turn per step (its class
        says so: ``SHARES_STEPS``), the batch ends where the leader's ends."""
        from ditax.serve.batch import bucket, generate_batch
        from ditax.serve.requests import call_of

        try:
            calls = [call_of(r) for r in requests]
        except DitaxError:              # the leader fails them before any jax work
            return
        strengths = requests[0].get("lora_strengths")
        if strengths is not None:
            worker.pipe.transformer.set_lora_strengths(strengths)

        stepped = getattr(worker, "SHARES_STEPS", False)

        def on_step(done: int) -> None:
            if stepped and self.receive()[0][0] == "halt":
                raise Halt()

        try:
            if batching:
                generate_batch(worker.pipe, calls, on_step,
                               pad_to=bucket(len(calls), worker.max_batch))
            else:
                worker.pipe(progress=False, **calls[0])
        except Halt:
            pass
        except (DitaxError, ValueError):
            pass                        # the leader fails the jobs with the same words

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


class Halt(Exception):
    """The leader ended the lock-step batch after this step (stopping, or cancelled)."""


def warm_in_order(worker, requests: list[dict]) -> float:
    """:meth:`~ditax.serve.worker.Worker.warm` with its programs compiled one after the other:
    a continuous batch's warm-up compiles the step programs in threads, and the arrays it puts
    on the mesh there (``jax.device_put`` of host values checks them against every process's
    with a collective) would meet the other processes' in another order. Returns seconds."""
    from ditax.pipelines.continuous import ContinuousBatch
    from ditax.serve.batch import batchable, warm_programs
    from ditax.serve.requests import call_of

    t0 = time.perf_counter()
    with worker.context():
        if worker.mode == "continuous" and batchable(worker.pipe):
            rows = ContinuousBatch(worker.pipe, worker.max_batch)
            for r in requests:
                rows.warm(call_of(r), strengths=r.get("lora_strengths"), threads=1)
        else:
            warm_programs(worker.pipe, [call_of(r) for r in requests],
                          worker.max_batch if worker.mode == "static" else 1)
    return time.perf_counter() - t0


def leader_worker(*args, **kw):
    """The leader's :class:`~ditax.serve.worker.Worker` (same arguments, ``group=`` among
    them) whose warm-up (:meth:`~ditax.serve.worker.Worker.warm`, ``--warm``) is a turn: the
    followers compile and run the same warm-up programs."""
    from ditax.serve.worker import Worker

    class LeaderWorker(Worker):
        def warm(self, requests: list[dict]) -> float:
            return warm_in_order(self, self.share([("warm", list(requests))])[0][1])

    return LeaderWorker(*args, **kw)


__all__ = ["Group", "Halt", "LOST_GRACE", "SettledStore", "TIMEOUT", "check_mesh", "fingerprint",
           "is_group", "leader_worker", "start"]
