"""The errors ditax raises for things a user can fix (bad config, request, weights, folder,
attention choice). Every one carries a message that names the value and the fix.

They share the base :class:`DitaxError` so the command line can tell a user's mistake (one
line, exit 2) from a failure (traceback with ``--debug``, exit 1). Each also derives from
the builtin a caller would expect (``ValueError``, ``FileNotFoundError``, ``RuntimeError``).
"""

from __future__ import annotations

import contextlib


class DitaxError(Exception):
    """Base of the user-fixable errors; the message is meant to be shown as is."""


class ConfigError(DitaxError, ValueError):
    """A configuration value is invalid; the message names the value and the fix."""


class RequestError(DitaxError, ValueError):
    """A generation / training request (sizes, prompt, image) cannot be served as given."""


class WeightError(DitaxError, ValueError):
    """Weights do not fit the model: missing / unexpected keys, wrong shapes, damaged files."""


class ModelNotFound(DitaxError, FileNotFoundError):
    """A path is not a model folder and could not be fetched from the hub."""


class PipelineLoadError(DitaxError, ValueError):
    """A pipeline folder is incomplete, its components do not fit together, or a file of it
    (``ditax_sample.json``) holds a bad value."""


class NonFiniteOutput(RuntimeError):
    """A run's latents or decoded frames hold NaN / inf: a failure (exit 1, nothing written),
    never a black video called a success; the message names the phase and the likely causes."""


class AttentionUnavailable(DitaxError, RuntimeError):
    """The requested attention backend cannot run with these inputs on this platform."""


def check_choice(key: str, value, allowed) -> None:
    """Raise :class:`ConfigError` unless ``value`` is one of ``allowed`` (with a did-you-mean)."""
    if value not in allowed:
        import difflib

        close = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"{key}={value!r} is not one of {', '.join(map(str, allowed))}{hint}")


#: the libraries whose own ``ValueError`` inside a run is a failure of the program, not of the
#: request: ditax checks a request before any work, so one that jax finds mid-run was missed
_LIBRARIES = ("jax", "jaxlib", "flax")


def raised_in_library(e: BaseException) -> bool:
    """Whether ``e`` was raised by a frame of :data:`_LIBRARIES` (the innermost frame's
    module), e.g. jax refusing arguments laid out unlike those a program was compiled for."""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    module = tb.tb_frame.f_globals.get("__name__", "") if tb is not None else ""
    return module.split(".")[0] in _LIBRARIES


@contextlib.contextmanager
def request_errors(*kinds: type[Exception]):
    """Inside, a ``ValueError`` (or one of ``kinds``) raised by a check of the user's request
    is that bad request: it becomes :class:`RequestError` (one line; exit 2 on the CLI, HTTP
    400 on the server). One raised by jax / flax themselves stays what it is: a failure of
    the run (exit 1), not the user's to fix."""
    try:
        yield
    except DitaxError:
        raise
    except (ValueError, *kinds) as e:
        if raised_in_library(e):
            raise
        raise RequestError(str(e)) from e


__all__ = ["request_errors", "check_choice", "DitaxError", "ConfigError", "RequestError", "WeightError", "ModelNotFound",
           "PipelineLoadError", "AttentionUnavailable"]
