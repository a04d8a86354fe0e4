"""diffusers ``AutoencoderKLLTX2Audio`` weights ↔ :class:`~.audio_model.LTX2AudioVAE`, and
loading the audio VAE from a folder (a pipeline folder's ``audio_vae/``).

The table is derived from the model: an NNX path joined with dots is the diffusers key (the
causal convolutions keep diffusers' inner ``conv``; the statistics ``latents_mean`` /
``latents_std`` are top-level buffers). Transforms: 4-D conv ``[O, I, kh, kw]`` →
``[kh, kw, I, O]`` (the attention blocks' 1x1 ``q`` / ``k`` / ``v`` / ``proj_out`` too); norm gains,
biases and statistics unchanged. Loading goes through :mod:`ditax.io.convert` (every key and
shape checked against ``config.json`` before anything is read; one
:class:`~ditax.errors.WeightError`).
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from ditax.io import convert
from ditax.models.common.components import component_config
from ditax.models.ltx2.audio.config import LTX2AudioVAEConfig
from ditax.models.ltx2.audio.layers import Buffer
from ditax.models.ltx2.audio.model import LTX2AudioVAE

CLASS_NAME = "AutoencoderKLLTX2Audio"
SUBFOLDER = "audio_vae"     # LTX2Pipeline's register_modules name (model_index.json)


def loaded_state(model: nnx.Module) -> nnx.State:
    """Everything a checkpoint holds for ``model``: parameters and buffers."""
    return nnx.state(model, nnx.Any(nnx.Param, Buffer))


def weight_table(model: LTX2AudioVAE) -> convert.Table:
    """The audio VAE's table, from a (possibly abstract) :class:`LTX2AudioVAE`."""
    rows = []
    for path, var in nnx.to_flat_state(loaded_state(model)):
        names = tuple(str(p) for p in path)
        ndim = len(var.get_value().shape)
        rows.append(convert.Row(names, ".".join(names),
                                convert.CONV2D if ndim == 4 else convert.ID))
    return convert.Table("LTX-2 audio VAE", tuple(rows))


def load_audio_vae(path, dtype="float32", *, attention: str = "xla") -> LTX2AudioVAE:
    """Read a diffusers ``AutoencoderKLLTX2Audio`` folder (``config.json`` +
    ``diffusion_pytorch_model.safetensors``), or a pipeline folder's ``audio_vae/``, into an
    :class:`LTX2AudioVAE` with parameters and buffers in ``dtype``."""
    folder, raw = component_config(path, SUBFOLDER, "audio VAE config", (CLASS_NAME,),
                                   f"the LTX-2 pipeline folder or its {SUBFOLDER}/")
    cfg = LTX2AudioVAEConfig.from_diffusers(raw)
    jdtype = jnp.dtype(dtype)
    return convert.load_module(
        lambda: LTX2AudioVAE(cfg, dtype=jdtype, rngs=nnx.Rngs(0), attention=attention), weight_table,
        folder, jdtype)


__all__ = ["CLASS_NAME", "SUBFOLDER", "load_audio_vae", "loaded_state", "weight_table"]
