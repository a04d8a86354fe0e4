"""Read safetensors weights — one file, a folder, or a sharded checkpoint — lazily, by slices.

Built on the ``safetensors`` library: ``safe_open(path, framework="np")`` memory-maps a file
and returns numpy arrays (bfloat16 as ``ml_dtypes.bfloat16``; ``ml_dtypes`` must be imported
first so numpy knows the name), and ``get_slice(key)[index]`` reads only the requested part of
a tensor. Sharded loading relies on that: each device's shard is read straight from the file
(see :func:`ditax.io.convert.load_params`), so no full copy of a large tensor is ever made.

A damaged file (truncated, corrupted header) or an index that names absent shards or tensors
raises :class:`ditax.errors.WeightError` naming the file and the fix.

8-bit checkpoints (:mod:`ditax.io.fp8`): ``float8_e4m3fn`` / ``float8_e5m2`` tensors (which
safetensors' numpy reader cannot build) are memory-mapped from the file's header offsets and
read dequantized to float32 (the loader casts to the compute dtype); ComfyUI ``_scaled`` files
(a ``scale_weight`` / ``weight_scale`` beside each 8-bit weight, a ``scaled_fp8`` marker) read
as ``weight · scale``, their scale, input-scale and marker keys hidden from :meth:`keys`.
A ``.gguf`` file opens as :class:`ditax.io.gguf.GGUFWeights` (the same interface).
"""

from __future__ import annotations

import os
import pathlib

import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy; safetensors' numpy reader needs it)
import numpy as np
from safetensors import SafetensorError, safe_open

from ditax.errors import WeightError
from ditax.io import fp8

INDEX_SUFFIX = ".safetensors.index.json"

_REDOWNLOAD = "download or save it again (an interrupted copy leaves such files)"


def is_single_file(path) -> bool:
    """Whether ``path`` is one ``.safetensors`` or ``.gguf`` checkpoint (a file, not a folder
    with ``config.json``)."""
    return pathlib.Path(path).is_file() and str(path).endswith((".safetensors", ".gguf"))


def _open(path: pathlib.Path):
    """``safe_open`` one file; a damaged file becomes a :class:`WeightError` naming it."""
    try:
        return safe_open(str(path), framework="np")
    except SafetensorError as e:
        raise WeightError(f"{path}: not a readable safetensors file — truncated or corrupted "
                          f"({e}); {_REDOWNLOAD}") from None
    except OSError as e:
        raise WeightError(f"{path}: cannot be read ({e})") from None


def _index_files(index: pathlib.Path) -> dict[str, pathlib.Path]:
    """``weight_map`` of a ``*.safetensors.index.json``: tensor name → shard path."""
    from ditax.io.files import read_json_object

    wmap = read_json_object(index, what="safetensors index", fix=_REDOWNLOAD,
                            error=WeightError).get("weight_map")
    if not isinstance(wmap, dict) or not all(isinstance(n, str) for n in wmap.values()):
        raise WeightError(f"{index}: not a safetensors index (no weight_map of tensor name -> "
                          f"file); {_REDOWNLOAD}")
    missing = sorted({n for n in wmap.values() if not (index.parent / n).is_file()})
    if missing:
        raise WeightError(f"{index.parent}: index {index.name} names shard(s) that are "
                          f"missing: {missing}; {_REDOWNLOAD}")
    return {k: index.parent / n for k, n in wmap.items()}


class Weights:
    """All tensors of a checkpoint: ``keys()``, ``shape(k)``, ``dtype(k)``, ``get(k)``,
    ``read(k, index)`` (a slice). Open one with :meth:`Weights.open`.

    Tensors come back as numpy arrays in their stored dtype (bfloat16 included) and stored
    layout; converting them to a model's layout is :mod:`ditax.io.convert`'s job.
    """

    def __init__(self, files: dict[str, pathlib.Path], source: pathlib.Path):
        self.source = source
        self._file = files
        self._handle = {p: _open(p) for p in sorted(set(files.values()))}
        for k, p in files.items():
            if k not in self._handle[p].keys():
                raise WeightError(f"{source}: the index says {k} is in {p.name}, but it is not; "
                                  f"{_REDOWNLOAD}")
        self._fp8 = fp8.Fp8Tensors(files, _REDOWNLOAD)
        for k in self._fp8.hidden:
            del self._file[k]

    @classmethod
    def open(cls, path: str | os.PathLike) -> "Weights":
        """A ``.safetensors`` file, a ``*.safetensors.index.json``, or a folder.

        In a folder an index wins; without one every ``*.safetensors`` file is read (a key in
        two files comes from the later name).
        """
        from ditax.io.files import path_arg

        path = path_arg(path, "weights path", WeightError,
                        "a .safetensors file or a folder of them")
        if path.is_file() and path.suffix == ".gguf":
            from ditax.io.gguf import GGUFWeights

            return GGUFWeights(path)
        if path.is_dir():
            index = sorted(path.glob("*" + INDEX_SUFFIX))
            if index:
                return cls(_index_files(index[0]), path)
            files = sorted(path.glob("*.safetensors"))
            if not files:
                raise WeightError(f"{path}: no *.safetensors weights found; save the model with "
                                  f"save_pretrained(safe_serialization=True)")
            return cls({k: p for p in files for k in _open(p).keys()}, path)
        if path.name.endswith(INDEX_SUFFIX):
            return cls(_index_files(path), path)
        if not path.is_file():
            raise WeightError(f"{path}: no such weights file")
        return cls({k: path for k in _open(path).keys()}, path)

    def keys(self) -> list[str]:
        return list(self._file)

    def metadata(self) -> dict[str, str]:
        """The files' ``__metadata__`` string maps, merged (e.g. a LoRA's adapter config)."""
        out = {}
        for h in self._handle.values():
            out.update(h.metadata() or {})
        return out

    def __contains__(self, key) -> bool:
        return key in self._file

    def __len__(self) -> int:
        return len(self._file)

    def file(self, key: str) -> pathlib.Path:
        """The file that holds ``key``."""
        return self._file[key]

    def _slice(self, key: str):
        return self._handle[self._file[key]].get_slice(key)

    def shape(self, key: str) -> tuple[int, ...]:
        """Stored shape, from the header (no tensor data is read)."""
        if key in self._fp8:
            return self._fp8.shape(key)
        return tuple(self._slice(key).get_shape())

    def dtype(self, key: str) -> np.dtype:
        """Stored dtype as numpy's (``ml_dtypes.bfloat16`` for BF16, ``float8_e4m3fn``…),
        read from an empty slice or, for 8-bit tensors, the header."""
        if key in self._fp8:
            return self._fp8.dtype(key)
        shape = self.shape(key)
        if not shape:
            return self.get(key).dtype
        return self.read(key, (slice(0, 0),) + (slice(None),) * (len(shape) - 1)).dtype

    def get(self, key: str) -> np.ndarray:
        """The whole tensor."""
        return self.read(key, ())

    def scale(self, key: str) -> np.ndarray | None:
        """The float32 scale a scaled 8-bit weight ``key`` is read times (scalar or per output
        row; :meth:`ditax.io.fp8.Fp8Tensors.scale`); None for any other tensor."""
        return self._fp8.scale(key) if key in self._fp8 else None

    def read(self, key: str, index: tuple) -> np.ndarray:
        """``tensor[index]`` (a tuple of slices) reading only that part of the file (8-bit
        tensors dequantized to float32, times their scale in a ``_scaled`` file)."""
        if key in self._fp8:
            return self._fp8.read(key, tuple(index))
        try:
            return self._slice(key)[tuple(index)]
        except SafetensorError as e:
            raise WeightError(f"{self._file[key]}: tensor {key} cannot be read ({e}); "
                              f"{_REDOWNLOAD}") from None
