"""JAX's persistent compilation cache for ditax's entry points: compiled programs kept on disk.

A fresh process (one ``ditax generate``) compiles every program again: the denoise step, the
VAE decode, the text encoder and the small eager ops. With the cache on, each compiled
executable is written to a folder and a later process with the same program loads it instead
of compiling. The key is jax's own (``jax._src.cache_key``): a hash of the lowered StableHLO
program (so the function, argument shapes and dtypes, shardings and mesh layout, static
arguments baked into it), the jax / jaxlib version, the backend and its version (CPU, the GPU
model and driver, the TPU generation), the XLA flags, the compile options (device assignment,
number of replicas / partitions) and the accelerator configuration. Anything that changes the
program changes the key, so a stale entry is never used; the folder only grows (delete it to
reclaim space). The pipelines' denoise step and VAE decode are kept beside, as whole
executables keyed before tracing (:mod:`ditax.exec_cache`, ``ditax-executables/``), so a
warm process does not even trace or lower them.

Where (``setting``, the config key ``compile_cache`` / the ``DITAX_CACHE_DIR`` variable):

- ``"auto"`` (default): inside an enclosing :func:`compile_cache` scope, that scope's choice;
  else ``$DITAX_CACHE_DIR`` when set; else the cache the process already configured for jax
  (``JAX_COMPILATION_CACHE_DIR`` / ``jax.config``, or jax's cache switched off), left alone;
  else the per-user folder ``$XDG_CACHE_HOME/ditax/jax`` (``~/.cache/ditax/jax``);
- ``"none"`` (or ``off``): no persistent cache in the scope (nothing read, nothing written);
- anything else: that folder (``~`` expanded; created on first write).

Nothing happens at import: the CLI and the pipelines enter :func:`compile_cache` visibly, and
leaving the scope restores jax's previous settings. The cache is trusted code: do not point it
at a folder other users can write.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import pathlib
from collections.abc import Iterator

ENV = "DITAX_CACHE_DIR"
OFF_WORDS = ("none", "off", "null", "false")

# the settings a scope changes: jax's name -> the value inside an enabled scope (None = the dir)
_FLAGS = {
    "jax_enable_compilation_cache": True,
    "jax_compilation_cache_dir": None,
    # cache every program, however quick to compile or small (CPU programs are both)
    "jax_persistent_cache_min_compile_time_secs": 0.0,
    "jax_persistent_cache_min_entry_size_bytes": -1,
}

# True while a compile_cache scope is active (its "auto" children keep its choice)
_ACTIVE: contextvars.ContextVar = contextvars.ContextVar("ditax_compile_cache", default=False)


def default_cache_dir() -> pathlib.Path:
    """The per-user folder: ``$XDG_CACHE_HOME/ditax/jax``, else ``~/.cache/ditax/jax``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "ditax" / "jax"


def _folder(text) -> pathlib.Path | None:
    text = os.fspath(text).strip()
    if text.lower() in OFF_WORDS or not text:
        return None
    return pathlib.Path(text).expanduser().absolute()


def _choice(setting) -> tuple[bool, pathlib.Path | None]:
    """``(keep, folder)``: ``keep`` when ``"auto"`` defers to what is in effect (an enclosing
    scope, the user's jax configuration), else the folder to use (None = off)."""
    if setting is None:
        return False, None
    if str(setting).strip().lower() != "auto":
        return False, _folder(setting)
    if _ACTIVE.get(False):
        return True, None
    if os.environ.get(ENV):
        return False, _folder(os.environ[ENV])
    import jax

    if jax.config.jax_compilation_cache_dir or not jax.config.jax_enable_compilation_cache:
        return True, None
    return False, default_cache_dir()


def resolve_cache_dir(setting="auto") -> pathlib.Path | None:
    """The folder that ``setting`` (see the module docstring) makes jax's persistent cache use
    here and now; None = off."""
    keep, folder = _choice(setting)
    return active_cache_dir() if keep else folder


@contextlib.contextmanager
def compile_cache(setting="auto") -> Iterator[pathlib.Path | None]:
    """Inside, jax's persistent compilation cache is the folder ``setting`` resolves to (or
    off for ``"none"``); yields that folder (None = off). On exit jax's previous settings
    come back. Nested scopes with ``"auto"`` keep the outer choice.

    Uses jax's public configuration (``jax_compilation_cache_dir``,
    ``jax_persistent_cache_min_compile_time_secs`` = 0 and
    ``jax_persistent_cache_min_entry_size_bytes`` = -1 so that small, quick CPU programs are
    cached too) and ``jax.experimental.compilation_cache``'s ``reset_cache`` so that a change
    takes effect in a process that has compiled before. Not thread-safe: jax's cache settings
    are process-wide while the scope lasts.
    """
    keep, folder = _choice(setting)
    if keep:
        yield active_cache_dir()
        return
    import jax
    from jax.experimental.compilation_cache import compilation_cache as cc

    # off: jax's switch too (with no folder jax would still hash every program for a key)
    wanted = ({"jax_enable_compilation_cache": False} if folder is None
              else dict(_FLAGS, jax_compilation_cache_dir=str(folder)))
    old = {name: getattr(jax.config, name) for name in wanted}
    wanted = {name: value for name, value in wanted.items() if old[name] != value}
    old = {name: old[name] for name in wanted}
    for name, value in wanted.items():
        jax.config.update(name, value)
    # jax opens the folder once per process: make it open this one (and the old one after)
    changed = bool({"jax_enable_compilation_cache", "jax_compilation_cache_dir"} & set(wanted))
    if changed:
        cc.reset_cache()
    token = _ACTIVE.set(True)
    try:
        yield folder
    finally:
        _ACTIVE.reset(token)
        for name, value in old.items():
            jax.config.update(name, value)
        if changed:
            cc.reset_cache()


def active_cache_dir() -> pathlib.Path | None:
    """The folder jax's persistent cache uses now (None = off); :mod:`ditax.exec_cache`
    keeps its executables beside jax's there."""
    import jax

    d = jax.config.jax_compilation_cache_dir
    return pathlib.Path(d) if d and jax.config.jax_enable_compilation_cache else None


def check_compile_cache(setting) -> None:
    """Raise :class:`~ditax.errors.ConfigError` for a ``compile_cache`` value that names an
    existing file (a folder is needed)."""
    from ditax.errors import ConfigError

    if str(setting).strip().lower() == "auto":
        return
    folder = _folder(setting)
    if folder is not None and folder.exists() and not folder.is_dir():
        raise ConfigError(f"compile_cache={setting!r} is a file; give a folder for compiled "
                          f"programs, 'auto' ({default_cache_dir()}) or 'none' to turn it off")


__all__ = ["ENV", "active_cache_dir", "check_compile_cache", "compile_cache",
           "default_cache_dir", "resolve_cache_dir"]
