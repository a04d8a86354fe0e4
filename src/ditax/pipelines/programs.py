"""Ahead-of-time compiled programs of a pipeline: the denoise step and the VAE decode.

Before the first step of a call, the pipeline asks :class:`Programs` for the programs of this
request's signature; the first request of a signature lowers the jitted functions on abstract
arguments (``jax.ShapeDtypeStruct``: shape, dtype, sharding, weak type) and compiles them
(``jit(...).lower(...).compile()``), so compile time is its own phase in the timing line and
never lands inside the first step or the decode. Later requests of the same signature reuse the
compiled objects, which the pipeline owns (no lookup in jax's dispatch caches). With jax's
persistent cache on (:mod:`ditax.compile_cache`) the program of a signature seen by an earlier
process is a read from disk (:mod:`ditax.exec_cache`: the executable itself, keyed before
tracing, so neither tracing nor lowering runs again; jax's cache below it for what that one
cannot hold).

A compiled program is the one the jitted call would build (same function, same static and
abstract arguments), so results are bit-identical to calling the jitted function. A step's
program also pins its outputs to the layout its fed-back inputs came in (``carry``): on a mesh
XLA hands a batch's latents back split over the batch axes, which the next step's call —
compiled for the inputs' layout — would reject; pinned, the loop feeds them back as they are
(no copy between steps).

A warm-up may compile a request's programs without running it: inside
:meth:`Programs.deferring` a program not yet built is noted (its key and its build) instead of
compiled, and :meth:`Programs.build_all` compiles the noted ones later, in parallel threads —
the same keys and builds, so a real call afterwards finds each program built.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jax

from ditax import exec_cache
from ditax.compile_cache import compile_cache
from ditax.phases import phase


def abstract(x) -> jax.ShapeDtypeStruct:
    """What a compiled program is specialised on: ``x``'s shape, dtype, weak type, and its
    sharding when committed to it (an uncommitted array follows the others, as in a jit call)."""
    committed = getattr(x, "committed", False)
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding if committed else None,
                                weak_type=bool(getattr(x, "weak_type", False)))


def signature(static: Hashable, args) -> tuple:
    """A hashable key of a call: its static part, the argument tree and each leaf's
    :func:`abstract` value."""
    leaves, tree = jax.tree.flatten(args)
    return static, tree, tuple(abstract(leaf) for leaf in leaves)


class Programs:
    """Compiled programs by signature, and the seconds spent compiling in the current call."""

    def __init__(self):
        self._compiled: dict[tuple, Any] = {}
        self._deferred: dict[tuple, Callable[[], Any]] | None = None
        self.seconds = 0.0

    def get(self, key: tuple, build: Callable[[], Any]):
        """The program for ``key``, built (and timed into :attr:`seconds`) on first use, or
        read from the executable cache (:func:`ditax.exec_cache.cached`) where an earlier
        process stored it. Inside :meth:`deferring`, a program not built yet is noted and
        None returned."""
        if key not in self._compiled and self._deferred is not None:
            self._deferred.setdefault(key, build)
            return None
        if key not in self._compiled:
            t0 = time.perf_counter()
            with phase("compile"):
                self._compiled[key] = exec_cache.cached(key, build)
            self.seconds += time.perf_counter() - t0
        return self._compiled[key]

    @contextlib.contextmanager
    def deferring(self):
        """Inside, :meth:`get` (so :meth:`step` and :meth:`decode`) builds nothing: each program
        not built yet is noted in the yielded ``{key: build}`` and None stands in for it (a
        warm-up's dry run, whose steps and decode do not run). Used by one thread while no
        other uses these programs."""
        self._deferred = noted = {}
        try:
            yield noted
        finally:
            self._deferred = None

    def build_all(self, noted: dict, threads: int = 4) -> dict:
        """Build the programs :meth:`deferring` noted (``{key: build}``), ``threads`` at a time;
        returns ``{key: (seconds, exception or None)}`` (a failed build raises nothing here,
        so that the caller can say which request size it was)."""
        def one(item):
            key, build = item
            t0 = time.perf_counter()
            try:
                self.get(key, build)
                return key, (time.perf_counter() - t0, None)
            except Exception as e:  # noqa: BLE001 — handed back, named by the caller
                return key, (time.perf_counter() - t0, e)

        if threads <= 1 or len(noted) <= 1:
            return dict(map(one, noted.items()))
        with ThreadPoolExecutor(min(threads, len(noted))) as pool:
            return dict(pool.map(one, noted.items()))

    def step(self, jitted, static: tuple, args: tuple, carry: tuple[int, ...] | None = None):
        """``jitted`` (static arguments first, then ``args``) compiled for ``args``' abstract
        values; call it with ``args`` alone. ``carry``: the program's outputs are its next
        call's inputs — output ``k`` is laid out as ``args[carry[k]]`` came in
        (:func:`placed_as`), so a loop feeding them back runs this program again."""
        key = signature((jitted, static, carry), args)
        shapes = jax.tree.map(abstract, args)
        outs = None if carry is None else placed_as(shapes, carry)
        if outs is None:
            return self.get(key, lambda: jitted.lower(*static, *shapes).compile())
        return self.get(key, lambda: jax.jit(functools.partial(jitted, *static),
                                             out_shardings=outs).lower(*shapes).compile())

    def decode(self, vae, shape: tuple[int, ...], sharding=None):
        """``vae.compile_decode(shape, sharding)``'s ``(first, rest)`` programs, once per
        (VAE parameters' signature, latent shape, sharding)."""
        from flax import nnx

        graphdef, state = nnx.split(vae)
        key = signature(("decode", graphdef, tuple(shape), sharding), state)
        return self.get(key, lambda: vae.compile_decode(shape, sharding))


def placed_as(shapes: tuple, carry: tuple[int, ...]):
    """The out_shardings that lay a program's outputs out as its arguments ``carry`` came in
    (``shapes``: the arguments' :func:`abstract` values; an uncommitted leaf's None leaves
    that output to XLA), or None when no such argument is placed (one device: the program
    as jitted). On a mesh XLA would otherwise hand a batch back split over the batch axes,
    and the program, compiled for replicated inputs, rejects that layout at its next call."""
    outs = tuple(jax.tree.map(lambda a: a.sharding, shapes[i]) for i in carry)
    placed = jax.tree.leaves(outs, is_leaf=lambda s: s is None)
    return outs if any(s is not None for s in placed) else None


def in_compile_cache(method):
    """Run a pipeline method inside ``compile_cache(self.compile_cache)`` (jax's settings come
    back when it returns)."""
    @functools.wraps(method)
    def scoped(self, *args, **kwargs):
        with compile_cache(self.compile_cache):
            return method(self, *args, **kwargs)
    return scoped


__all__ = ["Programs", "abstract", "in_compile_cache", "placed_as", "signature"]
