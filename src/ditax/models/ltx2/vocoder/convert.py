"""diffusers ``LTX2Vocoder`` / ``LTX2VocoderWithBWE`` weights ↔ ditax's vocoders, and loading
a vocoder folder (a pipeline folder's ``vocoder/``; the folder's ``_class_name`` picks the kind).

The table is derived from the model: an NNX path joined with dots is the diffusers key.
Transforms (torch → ours): a transposed conv's ``weight`` (under ``upsamplers``) ``[I, O, k]`` →
``[k, I, O]``; every other 3-D weight (``Conv1d``, and the BWE's STFT bases, which are conv
kernels ``[2F, 1, n]``) ``[O, I, k]`` → ``[k, I, O]``; biases, Snake parameters, the anti-alias
``filter`` s ``[1, 1, k]`` and the ``mel_basis`` unchanged. The BWE's resampler filter is not in
checkpoints (diffusers computes it too).
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from ditax.errors import WeightError
from ditax.io import convert
from ditax.io.files import read_model_json
from ditax.io.hub import resolve_folder
from ditax.models.ltx2.audio.layers import Buffer
from ditax.models.ltx2.vocoder.bwe import LTX2VocoderWithBWE
from ditax.models.ltx2.vocoder.config import LTX2VocoderBWEConfig, LTX2VocoderConfig
from ditax.models.ltx2.vocoder.model import LTX2Vocoder

SUBFOLDER = "vocoder"       # LTX2Pipeline's register_modules name (model_index.json)
CLASSES = {"LTX2Vocoder": (LTX2VocoderConfig, LTX2Vocoder),
           "LTX2VocoderWithBWE": (LTX2VocoderBWEConfig, LTX2VocoderWithBWE)}
CONV1D = convert.Transform("conv1d", (2, 1, 0))            # [O, I, k] -> [k, I, O]
CONV_TRANSPOSE1D = convert.Transform("conv_transpose1d", (2, 0, 1))   # [I, O, k] -> [k, I, O]


def _row(path: tuple, ndim: int) -> convert.Row:
    names = tuple(str(p) for p in path)
    transform = convert.ID
    if ndim == 3 and names[-1] != "filter":
        transform = CONV_TRANSPOSE1D if "upsamplers" in names else CONV1D
    return convert.Row(names, ".".join(names), transform)


def weight_table(model: LTX2Vocoder | LTX2VocoderWithBWE) -> convert.Table:
    """The vocoder's table, from a (possibly abstract) model of either kind."""
    state = nnx.state(model, nnx.Any(nnx.Param, Buffer))
    return convert.Table("LTX-2 vocoder", tuple(
        _row(path, len(var.get_value().shape)) for path, var in nnx.to_flat_state(state)))


def load_vocoder(path, dtype="float32") -> LTX2Vocoder | LTX2VocoderWithBWE:
    """Read a diffusers ``LTX2Vocoder`` (LTX-2.0) or ``LTX2VocoderWithBWE`` (LTX-2.3 / 2.5)
    folder, or a pipeline folder's ``vocoder/``, with parameters and buffers in ``dtype``; both
    kinds are called ``vocoder(mel)`` → waveform ``[B, channels, samples]`` at
    ``vocoder.sample_rate``."""
    folder = resolve_folder(path, SUBFOLDER)
    raw = read_model_json(folder / "config.json", "vocoder config")
    name = raw.get("_class_name")
    if name not in CLASSES:
        raise WeightError(f"{folder}: config.json is a {name!r}, not one of "
                          f"{', '.join(CLASSES)}; point at the LTX-2 pipeline folder or its "
                          f"{SUBFOLDER}/")
    config_cls, model_cls = CLASSES[name]
    cfg = config_cls.from_diffusers(raw)
    jdtype = jnp.dtype(dtype)
    return convert.load_module(lambda: model_cls(cfg, dtype=jdtype, rngs=nnx.Rngs(0)), weight_table, folder, jdtype)


__all__ = ["CLASSES", "SUBFOLDER", "load_vocoder", "weight_table"]
