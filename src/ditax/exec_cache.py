"""Compiled executables on disk, keyed before tracing: a warm process skips lowering too.

jax's persistent cache (:mod:`ditax.compile_cache`) keys on the *lowered* program, so every
process still traces and lowers each program before it can read the compiled one from disk;
on a TPU that alone is seconds a program (the Wan VAE's Pallas decode: ~5-7 s each for its two
programs). :func:`cached` sits above it: the pipeline's programs (:class:`~ditax.pipelines
.programs.Programs`) are looked up by a digest of what they are built from, and a hit is
``jax.experimental.serialize_executable.deserialize_and_load`` of the stored executable: no
trace, no lowering, no compile.

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

Files live in ``<compile cache folder>/ditax-executables/<digest>.pkl``: the same on/off
switch and folder as jax's persistent cache (on only while jax's cache is), written to a
temporary file and renamed (two processes writing one key both write whole files; the last
rename wins, and either is the same program). A file that cannot be read, was written by
another format, or holds another key is a miss (logged at debug) and is rewritten. A value
to store is built with jax's cache off (an executable jax read from its cache does not always
serialize again faithfully: on CPU the copy lacks its kernels), so the first process of a key
compiles these programs in full. A program that cannot be serialized (host callbacks,
effects, constants, a backend without it) leaves a marker instead, and later processes build
it with jax's cache on. Like jax's folder, this one only grows (jax's
``jax_compilation_cache_max_size`` does not reach it): delete it to reclaim space.
The cache is trusted code (loading an executable can run code): do not point it at a folder
other users can write.
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import io
import logging
import os
import pathlib
import pickle
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import jax

log = logging.getLogger(__name__)

FORMAT = 1
SUBDIR = "ditax-executables"
PROTOCOL = 4
_VALUE, _MARKER = "value", "not storable"   # what a file holds after its header
# a jax.monitoring duration event for each executable read from this cache (ditax serve's
# /metrics counts it as a program read from the persistent cache)
LOADED = "/ditax/exec_cache/loaded_duration"
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


@functools.lru_cache(maxsize=None)
def process_start() -> float:
    """When this process started (seconds since the epoch; a little early rather than late):
    Linux's ``/proc``, elsewhere when this module was imported."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])   # field 22, starttime
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return _IMPORTED


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
    return (sys.version, FORMAT, *((name, version(name)) for name in _PACKAGES))


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


def _serialize(compiled) -> tuple:
    """``compiled`` as ``(platform, device ids, executable bytes, in_tree, out_tree)``."""
    from jax.experimental.serialize_executable import serialize

    unloaded = getattr(compiled._executable, "_unloaded_executable", None)
    if unloaded is None:
        raise Uncacheable("its executable keeps no serializable form")
    if (unloaded.host_callbacks or unloaded.keepalive or unloaded.ordered_effects
            or unloaded.unordered_effects):
        raise Uncacheable("it calls back to the host or has effects")
    devices = list(unloaded.device_list)
    try:
        payload = serialize(compiled)
    except Exception as e:   # ValueError, NotImplementedError (constants), a backend's own
        raise Uncacheable(f"serialize: {type(e).__name__}: {e}") from None
    return (devices[0].platform, [d.id for d in devices], *payload)


def _deserialize(platform: str, ids: list, executable: bytes, in_tree, out_tree):
    from jax.experimental.serialize_executable import deserialize_and_load

    t0 = time.perf_counter()
    by_id = {d.id: d for d in jax.devices(platform)}
    devices = [by_id[i] for i in ids]
    compiled = deserialize_and_load(executable, in_tree, out_tree, backend=devices[0].client,
                                    execution_devices=devices)
    jax.monitoring.record_event_duration_secs(LOADED, time.perf_counter() - t0)
    return compiled


class _ValuePickler(pickle.Pickler):
    """Pickles a built value (a compiled program, or a tuple of them with plain data),
    each ``jax.stages.Compiled`` as its serialized executable and each device by id."""

    def persistent_id(self, obj):
        if isinstance(obj, jax.stages.Compiled):
            return ("compiled", _serialize(obj))
        if isinstance(obj, jax.Device):
            return ("device", obj.platform, obj.id)
        return None


class _ValueUnpickler(pickle.Unpickler):
    def persistent_load(self, pid):
        if pid[0] == "compiled":
            return _deserialize(*pid[1])
        if pid[0] == "device":
            return {d.id: d for d in jax.devices(pid[1])}[pid[2]]
        raise pickle.UnpicklingError(f"unknown persistent id {pid[0]!r}")


def _path(folder: pathlib.Path, digest: str) -> pathlib.Path:
    return pathlib.Path(folder) / SUBDIR / f"{digest}.pkl"


def load(folder, digest: str) -> tuple[bool | None, Any]:
    """``(True, value)`` stored under ``digest`` in ``folder``; ``(None, None)`` where a
    marker says it cannot be stored; ``(False, None)``: a miss (absent, unreadable, another
    format or key)."""
    path = _path(folder, digest)
    if not path.exists():
        return False, None
    try:
        with open(path, "rb") as f:
            header = pickle.load(f)
            if header[:2] != (FORMAT, digest):
                raise ValueError(f"header {header!r}")
            if header[2] == _MARKER:
                return None, None
            return True, _ValueUnpickler(f).load()
    except Exception as e:   # a torn, foreign or stale file: rebuild, never fail
        log.debug("executable cache: %s unreadable (%s: %s); rebuilding", path,
                  type(e).__name__, e)
        return False, None


def store(folder, digest: str, value) -> bool:
    """Write ``value`` under ``digest`` (atomically: a temporary file, then a rename); where
    it cannot be serialized, a marker instead (logged at debug), and False."""
    buffer = io.BytesIO()
    try:
        pickle.dump((FORMAT, digest, _VALUE), buffer, protocol=PROTOCOL)
        _ValuePickler(buffer, protocol=PROTOCOL).dump(value)
        stored = True
    except Exception as e:   # Uncacheable, or a value pickle cannot hold
        log.debug("executable cache: not stored (%s)", e)
        buffer = io.BytesIO()
        pickle.dump((FORMAT, digest, _MARKER, str(e)), buffer, protocol=PROTOCOL)
        stored = False
    path = _path(folder, digest)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{digest}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(buffer.getvalue())
            os.replace(temp, path)
        except BaseException:
            os.unlink(temp)
            raise
    except OSError as e:
        log.debug("executable cache: %s not written (%s)", path, e)
        return False
    return stored


def cached(key, build: Callable[[], Any], folder=None):
    """``build()``'s value for ``key``, read from ``folder`` (default: the folder of jax's
    persistent cache in effect; None = off: just ``build()``) when an earlier process stored
    it, else built and stored.

    A value to store is built with jax's persistent cache off: an executable that jax read
    from its cache cannot always be serialized again faithfully (on CPU the copy misses its
    kernels: "Function ... not found" when called). Where it could not be stored (see
    :func:`store`) a marker says so, and later processes build it with jax's cache on."""
    from ditax.compile_cache import active_cache_dir, compile_cache

    folder = active_cache_dir() if folder is None else folder
    if folder is None:
        return build()
    try:
        digest = key_digest(key)
    except Uncacheable as e:
        log.debug("executable cache: key not cacheable (%s)", e)
        return build()
    found, value = load(folder, digest)
    if found:
        return value
    if found is None:   # the marker: not storable, jax's cache stands in
        return build()
    with compile_cache("none"):
        value = build()
    store(folder, digest, value)
    return value


__all__ = ["FORMAT", "LOADED", "SUBDIR", "Uncacheable", "cached", "key_digest", "load", "source_digest",
           "store"]
