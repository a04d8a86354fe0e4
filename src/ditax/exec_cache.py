"""Compiled executables on disk, keyed before tracing: a warm process skips lowering too.

jax's persistent cache (:mod:`ditax.compile_cache`) keys on the *lowered* program, so every
process still traces and lowers each program before it can read the compiled one from disk;
on a TPU that alone is seconds a program (the Wan VAE's Pallas decode: ~5-7 s each for its two
programs). :func:`cached` sits above it: the pipeline's programs (:class:`~ditax.pipelines
.programs.Programs`) are looked up by a digest of what they are built from, and a hit is
``jax.experimental.serialize_executable.deserialize_and_load`` of the stored executable: no
trace, no lowering, no compile.

The key (:func:`ditax.exec_key.key_digest`) must change whenever the program could: the
signature, the source, the versions, devices, jax config and contexts, flags (see there).

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

import contextlib
import io
import logging
import os
import pathlib
import pickle
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import jax

from ditax.exec_key import PROTOCOL, Uncacheable, key_digest

log = logging.getLogger(__name__)

FORMAT = 1
SUBDIR = "ditax-executables"
_VALUE, _MARKER = "value", "not storable"   # what a file holds after its header
# a jax.monitoring duration event for each executable read from this cache (ditax serve's
# /metrics counts it as a program read from the persistent cache)
LOADED = "/ditax/exec_cache/loaded_duration"


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


def _by_id(platform: str) -> dict:
    """This process's devices of ``platform`` by id."""
    return {d.id: d for d in jax.devices(platform)}


def _deserialize(platform: str, ids: list, executable: bytes, in_tree, out_tree):
    from jax.experimental.serialize_executable import deserialize_and_load

    t0 = time.perf_counter()
    by_id = _by_id(platform)
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
            return _by_id(pid[1])[pid[2]]
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


JAX_HIT = "/jax/compilation_cache/cache_hits"
_lock = threading.Lock()
_state_off = {"depth": 0, "saved": False, "hits": 0, "listening": False}


def _on_event(event: str, **kw) -> None:
    if event == JAX_HIT:
        with _lock:
            _state_off["hits"] += 1


def _jax_hits() -> int:
    """jax persistent-cache hits in this process so far (a listener from the first call)."""
    with _lock:
        if not _state_off["listening"]:
            jax.monitoring.register_event_listener(_on_event)
            _state_off["listening"] = True
        return _state_off["hits"]


@contextlib.contextmanager
def _jax_cache_off():
    """jax's persistent cache off while any thread builds a program to store (counted:
    overlapping builds in threads share one switch; jax's setting comes back after the
    last). Like :func:`~ditax.compile_cache.compile_cache`, not safe against another thread
    entering a cache scope meanwhile (what it reads then is not stored, see :func:`cached`)."""
    from jax.experimental.compilation_cache import compilation_cache as cc

    with _lock:
        if _state_off["depth"] == 0:
            _state_off["saved"] = jax.config.jax_enable_compilation_cache
            if _state_off["saved"]:
                jax.config.update("jax_enable_compilation_cache", False)
                cc.reset_cache()
        _state_off["depth"] += 1
    try:
        yield
    finally:
        with _lock:
            _state_off["depth"] -= 1
            if _state_off["depth"] == 0 and _state_off["saved"]:
                jax.config.update("jax_enable_compilation_cache", True)
                cc.reset_cache()


def _active_folder() -> pathlib.Path | None:
    """jax's cache folder in effect, as it is outside the builds' switch (another thread's
    build may have turned jax's cache off for itself)."""
    from ditax.compile_cache import active_cache_dir

    with _lock:
        if _state_off["depth"]:
            folder = jax.config.jax_compilation_cache_dir
            return pathlib.Path(folder) if folder and _state_off["saved"] else None
    return active_cache_dir()


def cached(key, build: Callable[[], Any], folder=None):
    """``build()``'s value for ``key``, read from ``folder`` (default: the folder of jax's
    persistent cache in effect; None = off: just ``build()``) when an earlier process stored
    it, else built and stored.

    A value to store is built with jax's persistent cache off: an executable that jax read
    from its cache cannot always be serialized again faithfully (on CPU the copy misses its
    kernels: "Function ... not found" when called). Should jax's cache have been read during
    the build all the same (another thread's :func:`~ditax.compile_cache.compile_cache`
    scope switched it on), nothing is stored. Where a value could not be stored (see
    :func:`store`) a marker says so, and later processes build it with jax's cache on."""
    folder = _active_folder() if folder is None else folder
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
    hits = _jax_hits()
    with _jax_cache_off():
        value = build()
    if _jax_hits() != hits:
        log.debug("executable cache: jax's cache was read while building; not stored")
    else:
        store(folder, digest, value)
    return value


__all__ = ["FORMAT", "LOADED", "SUBDIR", "Uncacheable", "cached", "key_digest", "load", "store"]
