"""Write a model's parameters as an upstream-format folder: ``config.json`` + safetensors.

The parameters go through the model's conversion :class:`~ditax.io.convert.Table` in the ditax
→ upstream direction (names, layouts), are cast to ``dtype`` and written with
``safetensors.numpy`` (``metadata={"format": "pt"}``, as diffusers / transformers write), so
diffusers' or transformers' ``from_pretrained`` reads the folder as it is. Both files are
written under temporary names and renamed together when both are whole
(:func:`ditax.io.outputs.staged`): a failed write (the disk full) is
:class:`~ditax.io.outputs.WriteFailed` naming the file, and what was there stays as it was.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np


def _numpy(tree, dtype):
    return {k: _numpy(v, dtype) if isinstance(v, dict) else np.asarray(v, np.float32).astype(dtype)
            for k, v in tree.items()}


def save_folder(folder, filename: str, table, params: dict, config: dict,
                dtype="float32") -> pathlib.Path:
    """``params`` (a pure parameter dict, e.g. ``nnx.to_pure_dict(nnx.state(m, nnx.Param))``)
    → ``folder/filename`` in ``dtype`` (``float32``, ``bfloat16``, ``float16``) and
    ``folder/config.json``. Returns the weights file."""
    import ml_dtypes  # noqa: F401 - registers bfloat16 with numpy
    from safetensors.numpy import save_file

    from ditax.io.convert import export

    from ditax.io.outputs import staged

    dt = np.dtype(ml_dtypes.bfloat16) if str(dtype) == "bfloat16" else np.dtype(dtype)
    tensors = export(table, _numpy(params, dt))
    folder = pathlib.Path(folder)
    path = folder / filename
    with staged() as stage:     # both files whole, renamed together (or neither)
        save_file({k: np.ascontiguousarray(v).astype(dt) for k, v in tensors.items()},
                  str(stage.file(path)), metadata={"format": "pt"})
        stage.file(folder / "config.json").write_text(json.dumps(config, indent=2))
    return path


def module_params(module) -> dict:
    """A module's parameters as a pure nested dict of arrays."""
    from flax import nnx

    return nnx.to_pure_dict(nnx.state(module, nnx.Param))


__all__ = ["save_folder", "module_params"]
