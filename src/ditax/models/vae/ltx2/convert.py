"""diffusers ``AutoencoderKLLTX2Video`` weights ↔ :class:`~ditax.models.vae.ltx2.LTX2VideoVAE`
parameters, and loading a VAE folder.

The table is derived from the model: an NNX path joined with dots is the diffusers key, except
that :class:`ditax.nn.Linear`'s ``kernel`` (the time embedders) and the shortcut LayerNorm's
``scale`` are torch's ``weight``. Transforms: 5-D conv ``[O, I, kt, kh, kw]`` → ``[kt, kh, kw, I,
O]``; the 1x1x1 shortcut conv ``[O, I, 1, 1, 1]`` → ``[I, O]``; ``Linear`` ``[O, I]`` → ``[I,
O]``; everything else (biases, norm gains, ``scale_shift_table``, the 0-d
``timestep_scale_multiplier``, the ``latents_mean`` / ``latents_std`` buffers) unchanged.

Loading goes through :mod:`ditax.io.convert` (every key and every shape checked against the
folder's ``config.json`` before anything is read; one :class:`~ditax.errors.WeightError`).
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from ditax.io import convert
from ditax.models.common.components import component_config
from ditax.models.vae.ltx2.config import LTX2VideoVAEConfig
from ditax.models.vae.ltx2.layers import Buffer
from ditax.models.vae.ltx2.model import LTX2VideoVAE

CLASS_NAME = "AutoencoderKLLTX2Video"
POINTWISE3D = convert.Transform("[O, I, 1, 1, 1] -> [I, O]", (1, 0), 3)


def _row(path: tuple, ndim: int) -> convert.Row:
    names = tuple(str(p) for p in path)
    if names[-1] == "kernel":                                   # nn.Linear: torch [O, I]
        return convert.Row(names, ".".join(names[:-1] + ("weight",)), convert.TRANSPOSE)
    if names[-2:-1] == ("norm3",) and names[-1] == "scale":     # nn.LayerNorm gain
        return convert.Row(names, ".".join(names[:-1] + ("weight",)))
    key = ".".join(names)
    if names[-2:] == ("conv_shortcut", "weight"):
        return convert.Row(names, key, POINTWISE3D)
    return convert.Row(names, key, convert.CONV3D if ndim == 5 else convert.ID)


def weight_table(model: LTX2VideoVAE) -> convert.Table:
    """The VAE's table (parameters and buffers), from a (possibly abstract) model."""
    state = nnx.state(model, nnx.Any(nnx.Param, Buffer))
    return convert.Table("LTX-2 video VAE", tuple(
        _row(path, len(var.get_value().shape)) for path, var in nnx.to_flat_state(state)))


def load_ltx2_video_vae(path, dtype="float32") -> LTX2VideoVAE:
    """Read a diffusers ``AutoencoderKLLTX2Video`` folder (``config.json`` +
    ``diffusion_pytorch_model.safetensors``), or a pipeline folder's ``vae/``, into an
    :class:`LTX2VideoVAE` with parameters in ``dtype`` (float32 or bfloat16)."""
    folder, raw = component_config(path, "vae", "VAE config", (CLASS_NAME,),
                                   "the LTX-2 pipeline's vae/ folder")
    cfg = LTX2VideoVAEConfig.from_diffusers(raw)
    jdtype = jnp.dtype(dtype)
    return convert.load_module(lambda: LTX2VideoVAE(cfg, dtype=jdtype, rngs=nnx.Rngs(0)), weight_table, folder, jdtype)


__all__ = ["CLASS_NAME", "load_ltx2_video_vae", "weight_table"]
