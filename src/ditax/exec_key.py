"""The key of :mod:`ditax.exec_cache`: a digest, taken before tracing, of everything a
compiled program could depend on.

The key (:func:`key_digest`, sha256) must change whenever the program could. It covers:

- the request's own key (``Programs``' signature: the jitted function's module and qualified
  name, the static arguments, the argument tree and each leaf's shape, dtype, weak type and
  sharding with its mesh and device ids), pickled without memo so equal values give equal
  bytes; a value that cannot be pickled this way (a lambda, a local function, a jitted local
  function) makes the program uncacheable (built as before, never stored);
- the source of every module a static argument names (its classes and functions: a family
  outside ditax too) and a digest of all of ditax's ``.py`` files (read again only when one
  changes: ~0.05 s). A source file changed after this process started makes its programs
  uncacheable (the code running may not be the code on disk, so neither read nor written);
- the versions of Python, jax, jaxlib, flax, numpy, ml_dtypes and libtpu / the GPU plugins;
  the backend's platform and platform version, every device's kind and id, the first
  device's memory limit (the decode's chunk length is chosen from it), the process index
  and count;
- every jax config value in effect here (``jax.config.values``, the context's
  ``jax.default_matmul_precision`` included; only the cache-location settings are left out);
- the environment variables ``XLA_FLAGS``, ``LIBTPU_INIT_ARGS`` and every ``JAX_*``,
  ``DITAX_*``, ``TPU_*``, ``NVTE_*`` one but the cache folders' and the server key;
- ditax's target platform (:func:`ditax.target_platform`), every ditax context variable
  (named ``ditax_*`` / ``wan_*``: a new one that changes a trace must be named so) and jax's
  thread-local contexts (mesh, abstract mesh, ``compute_on``, Pallas interpret mode).
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import io
import os
import pathlib
import pickle
import sys
import time

import jax

PROTOCOL = 4
_PACKAGES = ("jax", "jaxlib", "flax", "numpy", "ml_dtypes", "libtpu", "libtpu-nightly",
             "jax-cuda12-plugin", "jax-cuda12-pjrt", "jax-cuda13-plugin", "jax-cuda13-pjrt")
_ENV_PREFIXES = ("JAX_", "DITAX_", "TPU_", "NVTE_")
_ENV_NAMES = ("XLA_FLAGS", "LIBTPU_INIT_ARGS", "CUDA_VISIBLE_DEVICES")
# where caches live and the server's key: no part of a program
_ENV_SKIP = ("DITAX_CACHE_DIR", "JAX_COMPILATION_CACHE_DIR", "DITAX_API_KEY")
_CONTEXT_SKIP = ("ditax_phases", "ditax_compile_cache")


class Uncacheable(Exception):
    """A key or value that the disk cache cannot hold faithfully."""


@functools.lru_cache(maxsize=None)
def _jitted_type() -> type:
    return type(jax.jit(abs))


def _named(*parts):   # what a jitted function or a device stands for in a key (never called)
    raise AssertionError("key marker")


class _KeyPickler(pickle.Pickler):
    """Pickles a key by value (no memo: equal values, equal bytes whatever their identity)
    and notes the module of every class and function it names."""

    def __init__(self, file):
        super().__init__(file, protocol=PROTOCOL)
        self.fast = True   # no memo (a cyclic key is a RecursionError: uncacheable)
        self.modules: set[str] = set()

    def reducer_override(self, obj):
        if isinstance(obj, _jitted_type()):
            fn = getattr(obj, "__wrapped__", obj)
            name = getattr(fn, "__qualname__", "")
            if "<" in name or not name:
                raise Uncacheable(f"a jitted local function {name!r}")
            self.modules.add(fn.__module__)
            return _named, ("jitted", fn.__module__, name)
        if isinstance(obj, jax.Device):
            return _named, ("device", obj.platform, obj.id)
        if isinstance(obj, type) or callable(obj):
            module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "")
            if "<" in name:
                raise Uncacheable(f"a local function or class {name!r}")
            if module:
                self.modules.add(module)
        return NotImplemented


_IMPORTED = time.time()


#: how much earlier than Linux's /proc says :func:`process_start` puts the start: the
#: uptime's and the start ticks' 10 ms resolutions
_START_MARGIN = 0.03


@functools.lru_cache(maxsize=None)
def process_start() -> float:
    """When this process started (seconds since the epoch; a little early rather than late):
    on Linux the clock now less the seconds since the start (``/proc/uptime`` less the start
    in ticks after boot, both to 10 ms: ``btime``, whole seconds, put it up to 1 s early, and
    a file written in that second counted as changed while the process ran), less
    :data:`_START_MARGIN`, where it falls in the second ``btime`` allows (else that second's
    start: an uptime on another clock, as in some containers); elsewhere when this module was
    imported."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
        with open("/proc/uptime") as f:
            uptime, now = float(f.read().split()[0]), time.time()
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
    except (OSError, ValueError, IndexError, StopIteration):
        return _IMPORTED
    early = boot + ticks                          # btime is whole seconds: up to 1 s early
    start = now - (uptime - ticks) - _START_MARGIN
    return start if early - _START_MARGIN <= start <= min(early + 1, _IMPORTED) else early


def _state(path) -> tuple:
    """``(path, mtime_ns, size)`` of a source file; :class:`Uncacheable` when it changed
    after this process started (the code running may not be the code on disk)."""
    st = os.stat(path)
    if st.st_mtime >= process_start():
        raise Uncacheable(f"{path} changed since this process started")
    return str(path), st.st_mtime_ns, st.st_size


@functools.lru_cache(maxsize=None)
def _digest_files(states: tuple) -> str:
    h = hashlib.sha256()
    for path, _, _ in states:
        with open(path, "rb") as f:
            h.update(path.encode() + b"\0" + hashlib.sha256(f.read()).digest())
    return h.hexdigest()


def _module_digest(name: str) -> str:
    """The digest of module ``name``'s source file ("" for a built-in / compiled one, and for
    ditax's own: :func:`source_digest` covers them)."""
    path = getattr(sys.modules.get(name), "__file__", None)
    if name == "ditax" or name.startswith("ditax.") or not (path and path.endswith(".py")):
        return ""
    return _digest_files((_state(path),))


def source_digest() -> str:
    """sha256 of every ``.py`` file of the ditax package (paths and contents; read again only
    when a file's time or size changes); :class:`Uncacheable` when one changed after this
    process started."""
    root = pathlib.Path(__file__).resolve().parent
    return _digest_files(tuple(_state(p) for p in sorted(root.rglob("*.py"))))


@functools.lru_cache(maxsize=None)
def _versions() -> tuple:
    from importlib import metadata

    def version(name):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None
    return (sys.version, *((name, version(name)) for name in _PACKAGES))


def _devices() -> tuple:
    devices = jax.devices()
    first = devices[0]
    try:
        limit = (first.memory_stats() or {}).get("bytes_limit")
    except Exception:   # a backend without memory statistics
        limit = None
    return (jax.default_backend(), first.client.platform, first.client.platform_version,
            tuple((d.platform, d.device_kind, d.id, d.process_index) for d in devices),
            jax.process_index(), jax.process_count(), limit)


def _config() -> tuple:
    values = {name: value for name, value in jax.config.values.items()
              if "compilation_cache" not in name and "persistent_cache" not in name
              and name != "jax_explain_cache_misses"}
    values["jax_default_matmul_precision"] = jax.config.jax_default_matmul_precision
    return tuple(sorted((name, repr(value)) for name, value in values.items()))


def _environment() -> tuple:
    return tuple(sorted((name, value) for name, value in os.environ.items()
                        if (name in _ENV_NAMES or name.startswith(_ENV_PREFIXES))
                        and name not in _ENV_SKIP))


def _contexts() -> tuple:
    """The context a trace reads besides the config: jax's thread-local context managers
    (mesh, abstract mesh, compute_on, Pallas interpret mode, XLA metadata) and ditax's own
    context variables (named ``ditax_*`` / ``wan_*``: the target platform, the halo row split,
    the VAE's fast path), less those that never reach a trace (phases, the cache scope)."""
    from jax._src import config as jax_config

    managers = tuple((name, getattr(getattr(jax_config, name), "value", None))
                     for name in sorted(dir(jax_config)) if name.endswith("_context_manager"))
    ours = sorted(((var.name, value) for var, value in contextvars.copy_context().items()
                   if var.name.startswith(("ditax", "wan_")) and var.name not in _CONTEXT_SKIP),
                  key=lambda item: item[0])
    return managers, tuple(ours)


def key_digest(key) -> str:
    """The sha256 (hex) of ``key`` (a program's signature) and everything else the program
    depends on (module docstring); raises :class:`Uncacheable` when ``key`` cannot be
    pickled by value."""
    from ditax.parallel.platform import platform_of

    buffer = io.BytesIO()
    pickler = _KeyPickler(buffer)
    try:
        pickler.dump((key, _contexts()))
    except Uncacheable:
        raise
    except Exception as e:   # PicklingError, TypeError, RecursionError (a cycle), ...
        raise Uncacheable(f"{type(e).__name__}: {e}") from None
    modules = tuple((name, _module_digest(name)) for name in sorted(pickler.modules))
    h = hashlib.sha256(buffer.getvalue())
    h.update(repr((modules, source_digest(), _versions(), _devices(), _config(),
                   _environment(), repr(platform_of()))).encode())
    return h.hexdigest()


__all__ = ["PROTOCOL", "Uncacheable", "key_digest", "process_start", "source_digest"]
