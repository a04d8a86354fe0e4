"""``ditax serve`` with one model across several processes (hosts): the leader's and the
followers' sides of :mod:`ditax.serve.group` (``mesh.num_processes=N mesh.process_id=K
mesh.coordinator_address=HOST:PORT``); :mod:`ditax.cli.serve` calls them."""

from __future__ import annotations

import os
import pathlib

from ditax.errors import ConfigError
from ditax.serve.requests import Limits


def join_group(args, req, loras: list):
    """This process joins the group of ``req``'s mesh (``jax.distributed``; before the first
    jax call), starts its watchdog and agrees with the others on the model, the overrides and
    the LoRAs (another one's are one line, exit 2); returns the
    :class:`~ditax.serve.group.Group`."""
    from ditax.serve import group_start as groups

    settings = groups.fingerprint(req.root, args.overrides, loras, max_batch=args.max_batch,
                                  batching=args.batching)
    group = groups.start(req.cfg.mesh, args.process_timeout)
    group.watch()
    with group_exit(group, close=False):
        group.agree(settings)
    import jax

    what = ("serves HTTP; the others follow its turns" if group.leader else
            f"follows the leader at {req.cfg.mesh.coordinator_address}: it serves no HTTP and "
            f"opens no --db")
    print(f"{group.name()}: {group.processes} processes joined ({jax.device_count()} devices, "
          f"{jax.local_device_count()} here); this one {what}", flush=True)
    return group


def group_exit(group, close: bool = True):
    """Around a group's work: an error ends the process with its status at once, after ditax's
    one line (jax's shutdown barrier would wait for processes that are not coming); at the end
    the group closes (the leader tells the followers to stop)."""
    import contextlib

    from ditax.errors import DitaxError

    @contextlib.contextmanager
    def scope():
        if group is None:
            yield
            return
        try:
            yield
        except BaseException as e:
            group.exit_code = (2 if isinstance(e, DitaxError) else
                               130 if isinstance(e, KeyboardInterrupt) else 1)
            raise
        finally:
            if close:
                group.close()

    return scope()


def lead(group, state, server, store) -> None:
    """The leader's answers to its group: a follower's stop request is this server's own
    first signal; a lost follower (the process exits 1 just after) shows in ``/health``,
    stops the worker and hands its running jobs back to the queue."""
    import signal

    worker = state.worker

    def lost(message: str) -> None:
        state.health.update(group.health())
        worker.begin_stop()
        worker.hurry()
        worker.wake.set()
        back = [i for i in list(worker.running) if store.requeue(i)]
        if back:
            print(f"jobs {', '.join(back)} handed back to the queue ({message})", flush=True)

    group.on_lost = lost
    group.on_stop = lambda: server.handle_exit(signal.SIGTERM, None)


def follower(args, req, loras: list) -> int:
    """A follower process (``mesh.process_id`` > 0): join the group, load the same model on
    the same mesh, then apply the leader's turns until it stops (:meth:`Group.follow
    <ditax.serve.group.Group.follow>`); ``loras``: the ``--lora-dir`` files. No store, no
    port: ``--db``, ``--port``, ``--host``, ``--uds``, ``--output-dir`` and the request limits
    are the leader's; ``--max-batch`` and ``--batching`` are taken from it. A first SIGTERM /
    SIGINT asks the leader to stop the group; a second one leaves at once (exit 1)."""
    import signal
    import tempfile

    import ditax
    from ditax.front.run import run_context
    from ditax.serve.requests import BadRequest, check_body
    from ditax.serve.worker import Worker

    group = join_group(args, req, loras)

    def on_signal(sig, frame):
        name = signal.Signals(sig).name
        if group.stop_asked:
            print(f"{group.name()}: {name} again: leaving the group now (exit 1)", flush=True)
            os._exit(1)
        group.ask_stop()
        print(f"{group.name()}: {name}: the leader is asked to stop the group (a second signal "
              f"leaves at once)", flush=True)

    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, on_signal)
    with group_exit(group), tempfile.TemporaryDirectory(prefix="ditax_follower_") as tmp:
        out = pathlib.Path(tmp)          # the request check's output path; nothing is written
        try:
            load = check_body({"prompt": "a check of the server's settings"}, args.model,
                              args.overrides, str(out / "request.mp4"), Limits(),
                              loras=tuple(n for n, _ in loras),
                              lora_files=tuple(f for _, f in loras), pipelines=req.pipelines,
                              startup=True).load
        except BadRequest as e:
            raise ConfigError(str(e)) from None
        cache, mesh = load.compile_cache, load.make_mesh()
        with run_context(load.attention, mesh, compile_cache=cache,
                         status=not args.no_progress, precision=load.precision) as folder:
            path = load.path
            pipe = ditax.load_pipeline(path, mesh=mesh, **load.kwargs())
            print(f"compile cache: {folder or 'off'}; loaded {path} in {pipe.load_time:.1f}s",
                  flush=True)
            worker = Worker(pipe, None, out, max_batch=group.theirs["max_batch"],
                            batching=group.theirs["batching"], say=print,
                            context=lambda: run_context(load.attention, mesh,
                                                        precision=load.precision,
                                                        compile_cache=cache))
            group.follow(worker)
    print(f"{group.name()}: the leader stopped the group", flush=True)
    return 0


__all__ = ["follower", "group_exit", "join_group", "lead"]
