"""diffusers ``LTX2LatentUpsamplerModel`` weights ↔ :class:`~ditax.models.ltx2.upsampler.model
.LatentUpsampler` parameters, and loading a ``latent_upsampler/`` folder.

The table is derived from the model: an NNX path joined with dots is the diffusers key.
Transforms: 5-D conv ``[O, I, kt, kh, kw]`` → ``[kt, kh, kw, I, O]``, 4-D conv ``[O, I, kh, kw]``
→ ``[kh, kw, I, O]``; biases, GroupNorm gains and the blur's ``kernel`` buffer ``[1, 1, k, k]``
unchanged. Every key and shape is checked against ``config.json`` before anything is read
(:mod:`ditax.io.convert`; one :class:`~ditax.errors.WeightError`).
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from ditax.io import convert
from ditax.models.common.components import component_config
from ditax.models.ltx2.upsampler.model import LatentUpsampler
from ditax.models.ltx2.upsampler.config import LatentUpsamplerConfig
from ditax.models.vae.ltx2.layers import Buffer

CLASS_NAME = "LTX2LatentUpsamplerModel"
#: the class names published folders carry (the original release's, and diffusers')
CLASS_NAMES = (CLASS_NAME, "LTX2LatentUpsampler")


def _row(path: tuple, ndim: int) -> convert.Row:
    names = tuple(str(p) for p in path)
    transform = convert.ID
    if names[-1] == "weight" and ndim == 5:
        transform = convert.CONV3D
    elif names[-1] == "weight" and ndim == 4:
        transform = convert.CONV2D
    return convert.Row(names, ".".join(names), transform)


def weight_table(model: LatentUpsampler) -> convert.Table:
    """The upsampler's table (parameters and the blur buffer), from a (possibly abstract)
    model."""
    state = nnx.state(model, nnx.Any(nnx.Param, Buffer))
    return convert.Table("LTX-2 latent upsampler", tuple(
        _row(path, len(var.get_value().shape)) for path, var in nnx.to_flat_state(state)))


def load_latent_upsampler(path, dtype="float32") -> LatentUpsampler:
    """Read a diffusers ``LTX2LatentUpsamplerModel`` folder (``config.json`` +
    ``diffusion_pytorch_model.safetensors``), or a pipeline folder's ``latent_upsampler/``, into
    a :class:`LatentUpsampler` with parameters in ``dtype`` (float32 or bfloat16)."""
    folder, raw = component_config(path, "latent_upsampler", "latent upsampler config",
                                   CLASS_NAMES, "the LTX-2 latent upsampler's folder "
                                   "(latent_upsampler/)")
    cfg = LatentUpsamplerConfig.from_diffusers(raw)
    jdtype = jnp.dtype(dtype)
    return convert.load_module(lambda: LatentUpsampler(cfg, dtype=jdtype, rngs=nnx.Rngs(0)), weight_table, folder, jdtype)


__all__ = ["CLASS_NAME", "CLASS_NAMES", "load_latent_upsampler", "weight_table"]
