"""Read safetensors files (single or sharded with an index) as memory-mapped numpy arrays.

The ``safetensors`` package's numpy reader cannot return bfloat16 (numpy has no such dtype),
and Wan checkpoints are bfloat16. The file format is a little-endian u64 header length, a JSON
header ``{name: {dtype, shape, data_offsets}}`` and raw tensor bytes; here it is memory-mapped
and viewed through ``ml_dtypes`` so each tensor is read lazily and only once it is needed
(slicing a mapped tensor reads only that slice — how sharded loading avoids full copies).
"""

from __future__ import annotations

import json
import os
import pathlib
import struct

import ml_dtypes
import numpy as np

_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
    "BOOL": np.bool_, "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2,
}


class SafetensorsError(ValueError):
    """A safetensors file or index is missing, truncated or inconsistent."""


class SafetensorsFile:
    """Lazy access to one ``.safetensors`` file: ``keys()``, ``shape(k)``, ``get(k)``."""

    def __init__(self, path: str | os.PathLike):
        self.path = pathlib.Path(path)
        size = self.path.stat().st_size
        with open(self.path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise SafetensorsError(f"{self.path}: truncated (no header length)")
            (n,) = struct.unpack("<Q", raw)
            if n > size - 8:
                raise SafetensorsError(f"{self.path}: header length {n} exceeds file size {size}")
            try:
                header = json.loads(f.read(n))
            except json.JSONDecodeError as e:
                raise SafetensorsError(f"{self.path}: corrupted header ({e})") from None
        header.pop("__metadata__", None)
        self._offset = 8 + n
        self._header = header
        end = max((v["data_offsets"][1] for v in header.values()), default=0)
        if self._offset + end > size:
            raise SafetensorsError(
                f"{self.path}: truncated — tensors need {self._offset + end} bytes, file has "
                f"{size}; re-download it")
        self._mm = np.memmap(self.path, dtype=np.uint8, mode="r") if size else None

    def keys(self):
        return list(self._header)

    def shape(self, key) -> tuple[int, ...]:
        return tuple(self._header[key]["shape"])

    def get(self, key) -> np.ndarray:
        meta = self._header[key]
        if meta["dtype"] not in _DTYPES:
            raise SafetensorsError(f"{self.path}: tensor {key} has unsupported dtype {meta['dtype']}")
        dt = np.dtype(_DTYPES[meta["dtype"]])
        a, b = meta["data_offsets"]
        buf = self._mm[self._offset + a:self._offset + b]
        count = int(np.prod(meta["shape"])) if meta["shape"] else 1
        if (b - a) != count * dt.itemsize:
            raise SafetensorsError(f"{self.path}: tensor {key} byte size {b - a} does not match "
                                   f"shape {meta['shape']} x {dt}")
        return buf.view(dt).reshape(meta["shape"])


class SafetensorsCheckpoint:
    """All tensors of a model folder: one ``*.safetensors`` file or a sharded set with index."""

    def __init__(self, folder: str | os.PathLike, prefer: str | None = None):
        folder = pathlib.Path(folder)
        self.folder = folder
        index = sorted(folder.glob("*.safetensors.index.json"))
        files: list[pathlib.Path]
        self._where: dict[str, SafetensorsFile] = {}
        if index:
            with open(index[0]) as f:
                wmap = json.load(f).get("weight_map", {})
            names = sorted(set(wmap.values()))
            missing = [n for n in names if not (folder / n).exists()]
            if missing:
                raise SafetensorsError(f"{folder}: index {index[0].name} names shard(s) that are "
                                       f"missing: {missing}")
            opened = {n: SafetensorsFile(folder / n) for n in names}
            for k, n in wmap.items():
                if k not in opened[n]._header:
                    raise SafetensorsError(f"{folder}: index says {k} is in {n}, but it is not")
                self._where[k] = opened[n]
        else:
            files = sorted(folder.glob("*.safetensors"))
            if prefer:
                files = [p for p in files if p.name == prefer] or files
            if not files:
                raise SafetensorsError(f"{folder}: no *.safetensors weights found")
            for p in files:
                sf = SafetensorsFile(p)
                for k in sf.keys():
                    self._where[k] = sf

    def keys(self):
        return list(self._where)

    def __contains__(self, k):
        return k in self._where

    def shape(self, k):
        return self._where[k].shape(k)

    def get(self, k) -> np.ndarray:
        return self._where[k].get(k)
