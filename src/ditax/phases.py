"""What a long call is doing now — ``load``, ``text``, ``compile``, ``denoise``, ``decode`` … —
for status lines and for naming where a failure happened.

Library code marks its phases with ``with phase("compile"): ...``; that is a context variable
and a loop over (usually no) listeners, so it costs nothing measurable. Two things use it:

- a listener (:func:`listening`) is told when a phase starts and ends: the CLI's status line
  (:mod:`ditax.front.status`) shows "compiling …" there;
- an exception leaving a phase carries that phase's name (the innermost one): :func:`phase_of`
  reads it, so the CLI's out-of-memory report (:mod:`ditax.cli.oom`) can say "out of memory
  while compiling" and what to lower for that phase.

Phases nest (``compile`` runs inside ``denoise``); :func:`current` is the innermost one.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable

_current: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("ditax_phases",
                                                                           default=())
_listeners: list[Callable[[str, bool], None]] = []
_ATTR = "_ditax_phase"


@contextlib.contextmanager
def phase(name: str):
    """Run the block as phase ``name``: listeners hear ``(name, True)`` on entry and
    ``(name, False)`` on exit; an exception leaving it is tagged with ``name`` unless an inner
    phase tagged it first."""
    token = _current.set((*_current.get(), name))
    _tell(name, True)
    try:
        yield
    except BaseException as e:
        if phase_of(e) is None:
            _tag(e, name)
        raise
    finally:
        _current.reset(token)
        _tell(name, False)


def current() -> str | None:
    """The innermost phase running now (None outside any)."""
    stack = _current.get()
    return stack[-1] if stack else None


def phase_of(exc: BaseException) -> str | None:
    """The phase ``exc`` (or an exception it was raised from) left, or None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        name = getattr(exc, _ATTR, None)
        if name is not None:
            return name
        exc = exc.__cause__ or exc.__context__
    return None


@contextlib.contextmanager
def listening(listener: Callable[[str, bool], None]):
    """Call ``listener(name, started)`` at every phase's start and end inside the block."""
    _listeners.append(listener)
    try:
        yield listener
    finally:
        _listeners.remove(listener)


def _tell(name: str, started: bool) -> None:
    for fn in list(_listeners):
        fn(name, started)


def _tag(exc: BaseException, name: str) -> None:
    try:
        setattr(exc, _ATTR, name)
    except (AttributeError, TypeError):   # an exception type without a __dict__
        pass


__all__ = ["current", "listening", "phase", "phase_of"]
