"""Count XLA compilations in tests through jax's public monitoring events.

Each time jax hands a program to the XLA compiler it records the event
``/jax/core/compile/backend_compile_duration`` with ``fun_name="jit(<python name>)"``; a
listener registered with ``jax.monitoring`` sees every one. Tests use :func:`compiles` to assert
that a jitted step compiles at most once and is then reused, without reading jax's private
caches. ``test_schedulers.test_compile_counter_sees_compiles`` checks that the event still
exists, so a jax upgrade that renames it fails there instead of making these checks vacuous.
"""

from __future__ import annotations

import contextlib

import jax

BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"


class CompileLog:
    """Names of the programs compiled while :func:`compiles` was active, in order."""

    def __init__(self):
        self.names: list[str] = []

    def count(self, fun_name: str) -> int:
        """How many programs of the jitted Python function ``fun_name`` were compiled."""
        return sum(n == f"jit({fun_name})" for n in self.names)


@contextlib.contextmanager
def compiles():
    """``with compiles() as log: ...`` then ``log.count("_denoise_step")``."""
    log = CompileLog()

    def listen(event: str, duration: float, **kw):
        if event == BACKEND_COMPILE:
            log.names.append(str(kw.get("fun_name", "")))

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        yield log
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
