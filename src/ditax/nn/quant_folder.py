"""ditax's 8-bit transformer folder (``ditax convert --quantize int8|fp8``): what it holds.

A diffusers transformer folder (``config.json`` + safetensors, diffusers' key names and torch
layouts) whose block linears (those :func:`ditax.nn.quant.quantize_module` quantizes) are
stored in 8 bits:

- ``<layer>.weight``: ``int8`` (``I8``) or ``float8_e4m3fn`` (``F8_E4M3``), ``[out, in]``;
- ``<layer>.weight_scale``: float32 ``[out]``, one per output row: ``weight ≈ q · scale[:, None]``;
- every other tensor in the float dtype the model was loaded in;
- ``config.json``: the architecture plus ``"quantization_config": {"quant_method": "ditax",
  "weights": "int8" | "fp8", ...}``.

``ditax.load_transformer(folder, quantize=mode)`` reads it back as stored — the same 8-bit
kernels and scales, bit for bit, as quantize-on-read of the float checkpoint it came from
(:func:`ditax.nn.quant.stored_reader`); without ``quantize=`` it loads dequantized. diffusers
has no safetensors layout of its own for per-channel int8 / fp8 weights (its 8-bit paths are
quantization backends with their own serialisation: bitsandbytes, torchao, quanto), so none is
claimed: its ``from_pretrained`` refuses the folder (an unknown ``quant_method``) instead of
reading 8-bit values as floats. The fp8 tensors follow ComfyUI's ``_scaled`` naming
(``weight_scale`` beside each 8-bit weight) with a per-row scale.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import nnx

from ditax.nn.quant import FOLDER_METHOD, SCALE, quantized_kernels


def folder_config(config: dict, mode: str) -> dict:
    """``config`` (the architecture's diffusers ``config.json`` dict) with the folder's
    ``quantization_config``."""
    return {**config, "quantization_config": {
        "quant_method": FOLDER_METHOD, "weights": mode,
        "scales": "float32 per output row, <layer>.weight_scale",
        "layers": "block attention and FFN linears (ditax.nn.quant)"}}


class QuantizedTensors:
    """The folder's tensors from a module loaded with ``quantize=mode``: ``keys()``,
    ``shape(k)``, ``dtype(k)``, ``get(k)`` (what :func:`ditax.models.common.single_files.write_folder`
    reads). ``table``: the model's full conversion table (diffusers names); ``dtype``: the
    float tensors' dtype (None: as loaded)."""

    def __init__(self, module, table, dtype=None):
        from ditax.io.convert import export

        pure = nnx.to_pure_dict(nnx.state(module, nnx.Param))
        qpaths = set(quantized_kernels(pure))
        dtype = None if dtype is None else np.dtype(jnp.dtype(dtype))
        tensors = export(table, pure)
        for row in table.rows:
            if row.path not in qpaths:
                for key in table.names(row):
                    tensors[key] = tensors[key] if dtype is None else tensors[key].astype(dtype)
                continue
            parent = pure
            for k in row.path[:-1]:
                parent = next(v for name, v in parent.items() if str(name) == k)
            scale = np.asarray(parent[SCALE], np.float32)
            for i, key in enumerate(table.names(row)):
                s = scale[i] if row.stacked else scale
                if not key.endswith(".weight"):
                    raise ValueError(f"{key}: an 8-bit kernel's key must end in .weight")
                tensors[key[:-len("weight")] + "weight_scale"] = s.reshape(-1)
        self._t = {k: np.ascontiguousarray(v) for k, v in tensors.items()}

    def keys(self) -> list[str]:
        return list(self._t)

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._t[key].shape)

    def dtype(self, key: str) -> np.dtype:
        return self._t[key].dtype

    def get(self, key: str) -> np.ndarray:
        return self._t[key]


__all__ = ["folder_config", "QuantizedTensors"]
