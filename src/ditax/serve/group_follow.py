"""What the processes of a group run (:mod:`ditax.serve.group`): a follower applies the
leader's turns to its own worker (:class:`Following`: the continuous batch's operations, a
lock-step batch, the warm-up), and the leader's worker shares its warm-up as a turn
(:func:`leader_worker`), both compiling in one order (:func:`warm_in_order`).
"""

from __future__ import annotations

import time

from ditax.errors import DitaxError


class Following:
    """A follower's side of :class:`~ditax.serve.group.Group`: its loop over the leader's turns
    (the group gives ``receive``)."""

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


class Halt(Exception):
    """The leader ended the lock-step batch after this step (stopping, or cancelled)."""


def warm_in_order(worker, requests: list[dict]) -> float:
    """:meth:`~ditax.serve.worker.Worker.warm` with its programs compiled one after the other:
    a continuous batch's warm-up compiles the step programs in threads, and the arrays it puts
    on the mesh there (``jax.device_put`` of host values checks them against every process's
    with a collective) would meet the other processes' in another order; a static batch's
    compiles in one order too, as every process's does. Returns seconds."""
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
                          worker.max_batch if worker.mode == "static" else 1, say=worker.say,
                          threads=1)
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


__all__ = ["Following", "Halt", "leader_worker", "warm_in_order"]
