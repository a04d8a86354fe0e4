"""8-bit float tensors in safetensors files, and ComfyUI's ``_scaled`` fp8 checkpoints.

safetensors' numpy reader cannot build ``F8_E4M3`` / ``F8_E5M2`` arrays (it looks the dtype up
on numpy, which has none), so :class:`Fp8Tensors` reads them itself: the file header (8 bytes
little-endian length, then JSON ``{key: {dtype, shape, data_offsets}}``) gives each tensor's
bytes, memory-mapped as ``ml_dtypes.float8_e4m3fn`` / ``float8_e5m2`` so a slice reads only its
part. They come back dequantized to float32 (exact: every fp8 value is a float32 value).

ComfyUI ``*_fp8_scaled.safetensors`` files (the facts, from ComfyUI's loader): each 8-bit
linear weight ``L.weight`` has a float32 ``L.scale_weight`` (newer files: ``L.weight_scale``)
and dequantizes as ``weight.to(float) * scale``; ``L.scale_input`` / ``L.input_scale`` are
activation scales for fp8 matmuls (not needed to dequantize); a ``<prefix>scaled_fp8`` marker
tensor names the fp8 flavour. Those scale and marker keys are hidden from the checkpoint's
keys, so the strict key checks of :mod:`ditax.io.convert` see the model's keys only. A file
whose ``_quantization_metadata`` names a layer format other than fp8 is refused in one line.
The same read serves ditax's own 8-bit folders (``ditax convert --quantize``,
:mod:`ditax.nn.quant_folder`): int8 or fp8 ``L.weight`` with a float32 per-row ``L.weight_scale``;
:meth:`Fp8Tensors.scale` gives that scale itself, so a loader can keep the 8-bit values.
"""

from __future__ import annotations

import json
import pathlib

import ml_dtypes
import numpy as np

from ditax.errors import WeightError

FP8 = {"F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2}
_PLAIN = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16, "F64": np.float64,
          "I8": np.int8}     # int8 weights with a per-row scale (ditax convert --quantize int8)
SCALE_SUFFIXES = (".scale_weight", ".weight_scale")
HIDDEN_SUFFIXES = SCALE_SUFFIXES + (".scale_input", ".input_scale")
MARKER = "scaled_fp8"
FP8_FORMATS = ("float8_e4m3fn", "float8_e5m2")


def read_header(path: pathlib.Path, fix: str) -> tuple[dict, int]:
    """The JSON header of a safetensors file (tensor entries and ``__metadata__``) and the
    byte offset its tensor data starts at."""
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            return json.loads(f.read(n)), 8 + n
    except (OSError, ValueError) as e:
        raise WeightError(f"{path}: the safetensors header cannot be read ({e}); {fix}") from None


def _special(key: str, entry: dict) -> bool:
    """An 8-bit tensor, a scale or a marker: what this module reads or hides."""
    return (entry["dtype"] in FP8 or key.endswith(HIDDEN_SUFFIXES)
            or key.rsplit(".", 1)[-1] == MARKER)


def _check_formats(path: pathlib.Path, header: dict) -> None:
    meta = (header.get("__metadata__") or {}).get("_quantization_metadata")
    if meta is None:
        return
    try:
        layers = json.loads(meta).get("layers", {})
    except (ValueError, AttributeError):
        raise WeightError(f"{path}: _quantization_metadata is not JSON with 'layers'") from None
    bad = sorted({str(c.get("format")) for c in layers.values()} - set(FP8_FORMATS))
    if bad:
        raise WeightError(f"{path}: quantized layer format(s) {bad} are not supported; ditax "
                          f"reads {list(FP8_FORMATS)} safetensors and GGUF files (ditax.io.gguf)")


class Fp8Tensors:
    """The 8-bit (and scaled) tensors of a checkpoint's files ``{key: path}``.

    ``key in self``: read here (an fp8 tensor, or a weight with a scale); :attr:`hidden`: the
    scale / input-scale / marker keys the checkpoint's key list leaves out.
    """

    def __init__(self, files: dict[str, pathlib.Path], fix: str):
        self._entry: dict[str, tuple[pathlib.Path, int, dict]] = {}
        for path in sorted(set(files.values())):
            header, start = read_header(path, fix)
            entries = {k: e for k, e in header.items()
                       if k != "__metadata__" and files.get(k) == path}
            if not any(_special(k, e) for k, e in entries.items()):
                continue          # a plain file: safetensors reads all of it
            _check_formats(path, header)
            self._entry.update({k: (path, start, e) for k, e in entries.items()})
        keys = set(self._entry)
        self.hidden = sorted(k for k in keys if k.endswith(HIDDEN_SUFFIXES)
                             or k.rsplit(".", 1)[-1] == MARKER)
        self._scale = {}
        for k in keys:
            for suffix in SCALE_SUFFIXES:
                if k.endswith(suffix):
                    weight = k[:-len(suffix)] + ".weight"
                    if weight not in files:
                        raise WeightError(f"{files[k]}: {k} scales {weight}, which is not in the "
                                          f"checkpoint; {fix}")
                    self._scale[weight] = k
        self._managed = {k for k in keys if self._entry[k][2]["dtype"] in FP8} | set(self._scale)
        self._managed -= set(self.hidden)

    def __contains__(self, key) -> bool:
        return key in self._managed

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._entry[key][2]["shape"])

    def dtype(self, key: str) -> np.dtype:
        d = self._entry[key][2]["dtype"]
        return np.dtype(FP8.get(d) or _PLAIN[d])

    def _raw(self, key: str) -> np.ndarray:
        path, start, e = self._entry[key]
        dtype = self.dtype(key)
        begin = start + int(e["data_offsets"][0])
        shape = tuple(e["shape"])
        if not shape or int(np.prod(shape)) == 0:
            return np.fromfile(path, dtype, count=int(np.prod(shape)), offset=begin).reshape(shape)
        return np.memmap(path, dtype=dtype, mode="r", offset=begin, shape=shape)

    def scale(self, key: str) -> np.ndarray | None:
        """The float32 scale of the weight ``key`` (a scalar or one per output row, checked);
        None when ``key`` has none."""
        if key not in self._scale:
            return None
        s = np.asarray(self._raw(self._scale[key]), np.float32)
        if s.size != 1 and (s.shape[0] != self.shape(key)[0] or s.size != s.shape[0]):
            raise WeightError(f"{self._entry[key][0]}: {self._scale[key]} has shape {s.shape}; "
                              f"a scale is a scalar or one per output row of {key} "
                              f"{self.shape(key)}")
        return s.reshape(()) if s.size == 1 else s.reshape(-1)

    def read(self, key: str, index: tuple) -> np.ndarray:
        """``tensor[index]`` as float32, times its scale (scalar or per output channel)."""
        x = np.asarray(self._raw(key)[index], np.float32)
        s = self.scale(key)
        if s is None:
            return x
        if s.ndim == 0:
            return x * s
        rows = s[index[0] if index else slice(None)]
        return x * rows.reshape((-1,) + (1,) * (x.ndim - 1))


__all__ = ["Fp8Tensors", "read_header", "FP8", "FP8_FORMATS"]
