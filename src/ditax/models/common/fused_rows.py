"""A single-file checkpoint under another naming shown under diffusers keys, where a diffusers
tensor may be a row range of a fused stored tensor (BFL's FLUX.1 and FLUX.2 files: ``qkv``,
``linear1``, the final modulation's swapped halves).

:func:`plan_rows` maps each diffusers key to its :class:`Rows` (the stored tensors' row ranges
that make it) and lists the stored keys with the shapes they must have; :func:`mismatch` says
which stored keys are missing, unexpected or misshaped; :class:`FusedRowsView` is the file seen
under the diffusers keys with the protocol the loader reads, each read touching only the
stored rows it covers (so sharded reads stay per-device). A family's ``original_names`` gives
the two name rules (``tensor_key``, ``fused``).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np


@dataclasses.dataclass(frozen=True)
class Rows:
    """A diffusers tensor of ``shape`` as segments ``(its first row, stored key, the stored
    tensor's first row, rows)``: one segment unless it is a fused layer's member (or, in a
    layer stored with its halves swapped, two)."""

    shape: tuple[int, ...]
    segments: tuple[tuple[int, str, int, int], ...]


def plan_rows(expected: dict[str, tuple], prefix: str, tensor_key: Callable, fused: Callable):
    """Diffusers key → :class:`Rows`, and the stored keys → the shapes they must have.
    ``expected``: diffusers key → shape; ``prefix``: the file's key prefix; ``tensor_key``:
    diffusers key → (stored module name, stored suffix); ``fused``: a stored module name → its
    pieces ``(diffusers module, first, stop)`` in units of the pieces' width, or None."""
    sources, stored = {}, {}
    for key, shape in expected.items():
        rows = shape[0] if shape else 0
        orig, suffix = tensor_key(key)
        pieces = fused(orig)
        name = prefix + orig + suffix
        if pieces is None:
            sources[key] = Rows(shape, ((0, name, 0, rows),))
            stored[name] = tuple(shape)
            continue
        module = key[:len(key) - len(suffix)]
        width = rows // sum(b - a for m, a, b in pieces if m == module)   # D of the pieces
        segments, at = [], 0
        for m, a, b in pieces:        # in the fused tensor's row order
            if m == module:
                segments.append((a * width, name, at, (b - a) * width))
            at += (b - a) * width
        sources[key] = Rows(shape, tuple(sorted(segments)))
        stored[name] = (at,) + tuple(shape[1:])
    return sources, stored


def mismatch(weights, stored: dict[str, tuple]) -> tuple[list, list, list]:
    """``(missing, unexpected, misshaped)`` stored keys of ``weights`` against ``stored`` (key →
    shape), for :func:`ditax.io.convert.key_mismatch`; all empty when the file fits."""
    have = set(weights.keys())
    missing = [k for k in stored if k not in have]
    unexpected = sorted(have - set(stored))
    bad = [f"{k}: shape {tuple(weights.shape(k))} but the model expects {want}"
           for k, want in stored.items() if k in have and tuple(weights.shape(k)) != want]
    return missing, unexpected, bad


class FusedRowsView:
    """A checkpoint (a :class:`~ditax.io.weights.Weights`) shown under diffusers keys, with the
    protocol the loader reads: ``keys()``, ``shape``, ``dtype``, ``get``, ``read(key,
    index)``, ``metadata()``, ``source``."""

    def __init__(self, weights, sources: dict[str, Rows]):
        self._inner, self._sources = weights, sources
        self.source = weights.source

    def keys(self) -> list[str]:
        return list(self._sources)

    def __contains__(self, key) -> bool:
        return key in self._sources

    def __len__(self) -> int:
        return len(self._sources)

    def metadata(self) -> dict:
        return self._inner.metadata()

    def shape(self, key: str) -> tuple[int, ...]:
        return self._sources[key].shape

    def dtype(self, key: str) -> np.dtype:
        return self._inner.dtype(self._sources[key].segments[0][1])

    def get(self, key: str) -> np.ndarray:
        return self.read(key, ())

    def read(self, key: str, index: tuple) -> np.ndarray:
        """``tensor[index]`` (slices, step 1 on the rows) of the diffusers tensor ``key``,
        reading only the stored rows it covers."""
        src = self._sources[key]
        if not src.shape:
            return self._inner.read(src.segments[0][1], index)
        index = tuple(index)
        rows, rest = (index or (slice(None),))[0], index[1:]
        start, stop, step = rows.indices(src.shape[0])
        if step != 1:
            raise ValueError(f"{key}: a strided row read {rows} is not supported")
        parts = []
        for first, stored, offset, n in src.segments:
            lo, hi = max(start, first), min(stop, first + n)
            if lo < hi:
                part = slice(offset + lo - first, offset + hi - first)
                parts.append(self._inner.read(stored, (part,) + rest))
        if not parts:   # an empty range (the dtype probes read one)
            return self._inner.read(src.segments[0][1], (slice(0, 0),) + rest)
        return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)


__all__ = ["FusedRowsView", "Rows", "mismatch", "plan_rows"]
