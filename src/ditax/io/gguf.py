"""Read GGUF checkpoints (ComfyUI-GGUF's Wan / Flux files) through the ``gguf`` package.

:class:`GGUFWeights` has the interface of :class:`ditax.io.weights.Weights` (``keys``,
``shape``, ``dtype``, ``get``, ``read``, ``metadata`` …), so the strict key and shape checks and
the tables of :mod:`ditax.io.convert` apply unchanged; ``Weights.open`` returns one for a
``.gguf`` path. Tensors are dequantized to float32 on read by gguf's own
``gguf.quants.dequantize`` (the loader then casts to the compute dtype).

Layout facts (as ComfyUI-GGUF reads these files): a tensor's GGUF shape is in ggml order
(fastest dimension first), so its numpy shape is the reverse; a tensor the converter
reshaped (more than 4 dims, e.g. Wan's 5-D patch embedding, or rows that are not a whole
number of quant blocks) keeps its real shape in the ``comfy.gguf.orig_shape.<name>`` key
(an INT32 array). Supported types: :data:`SUPPORTED`; a file holding any other type is
refused when it is opened, in one line naming the type, the tensor and the supported ones.
"""

from __future__ import annotations

import pathlib

import numpy as np

from ditax.errors import WeightError

SUPPORTED = ("F32", "F16", "BF16", "Q8_0", "Q6_K", "Q5_K", "Q4_K")
ORIG_SHAPE = "comfy.gguf.orig_shape."
_FIX = "install it with pip install 'ditax[gguf]' (the gguf package)"


def _gguf():
    try:
        import gguf
    except ImportError:
        raise WeightError(f"reading .gguf checkpoints needs the gguf package; {_FIX}") from None
    return gguf


class GGUFWeights:
    """All tensors of one ``.gguf`` file, read (dequantized to float32) by name."""

    def __init__(self, path: pathlib.Path):
        gguf = _gguf()
        self.source = pathlib.Path(path)
        try:
            self._reader = gguf.GGUFReader(str(path))
        except (OSError, ValueError) as e:
            raise WeightError(f"{path}: not a readable GGUF file ({e}); download it again "
                              f"(an interrupted copy leaves such files)") from None
        self._tensors = {t.name: t for t in self._reader.tensors}
        for name, t in self._tensors.items():
            if t.tensor_type.name not in SUPPORTED:
                raise WeightError(f"{path}: tensor {name} is GGUF type {t.tensor_type.name}, "
                                  f"which ditax does not read; supported: "
                                  f"{', '.join(SUPPORTED)} (re-quantize the file to one of them)")
        self._shape = {name: self._orig_shape(name) or tuple(int(n) for n in reversed(t.shape))
                       for name, t in self._tensors.items()}
        self._last: tuple[str, np.ndarray] | None = None   # one dequantized tensor, reused

    def _orig_shape(self, name: str):
        field = self._reader.get_field(ORIG_SHAPE + name)
        if field is None:
            return None
        return tuple(int(field.parts[i][0]) for i in field.data)

    def keys(self) -> list[str]:
        return list(self._tensors)

    def metadata(self) -> dict[str, str]:
        """The file's string-valued key/value fields (``general.architecture`` …)."""
        gguf = _gguf()
        out = {}
        for name, field in self._reader.fields.items():
            if field.types == [gguf.GGUFValueType.STRING]:
                out[name] = str(field.contents())
        return out

    def __contains__(self, key) -> bool:
        return key in self._tensors

    def __len__(self) -> int:
        return len(self._tensors)

    def file(self, key: str) -> pathlib.Path:
        return self.source

    def shape(self, key: str) -> tuple[int, ...]:
        """The tensor's numpy (PyTorch) shape: its original one when the file records it."""
        return self._shape[key]

    def dtype(self, key: str) -> np.dtype:
        """float32: every tensor is read dequantized (:meth:`quant_type` names the stored
        type)."""
        return np.dtype(np.float32)

    def quant_type(self, key: str) -> str:
        """The stored GGUF type of ``key`` (``"Q8_0"``, ``"F16"`` …)."""
        return self._tensors[key].tensor_type.name

    def get(self, key: str) -> np.ndarray:
        return self.read(key, ())

    def read(self, key: str, index: tuple) -> np.ndarray:
        """``tensor[index]`` as float32. Quantized blocks run along whole rows, so the tensor
        is dequantized whole (and kept until another one is read: the shards of one sharded
        parameter dequantize it once)."""
        if self._last is None or self._last[0] != key:
            t = self._tensors[key]
            x = _gguf().quants.dequantize(t.data, t.tensor_type)
            self._last = (key, np.asarray(x, np.float32).reshape(self._shape[key]))
        return self._last[1][tuple(index)]


__all__ = ["GGUFWeights", "SUPPORTED"]
