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


@contextlib.contextmanager
def request_errors(*kinds: type[Exception]):
    """Inside, a ``ValueError`` (or one of ``kinds``) raised by a check of the user's request
    is that bad request: it becomes :class:`RequestError` (one line; exit 2 on the CLI, HTTP
    400 on the server)."""
    try:
        yield
    except DitaxError:
        raise
    except (ValueError, *kinds) as e:
        raise RequestError(str(e)) from e


__all__ = ["request_errors", "check_choice", "DitaxError", "ConfigError", "RequestError", "WeightError", "ModelNotFound",
           "PipelineLoadError", "AttentionUnavailable"]
