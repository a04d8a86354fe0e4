"""diffusers ``AutoencoderKL`` weights ↔ :class:`~ditax.models.vae.kl.FluxVAE` parameters,
and loading a VAE folder.

The table is derived from the model: an NNX parameter path joined with dots is the diffusers
key, except that :class:`ditax.nn.Linear`'s ``kernel`` is torch's ``weight``. Transforms:
4-D conv ``[O, I, kh, kw]`` → ``[kh, kw, I, O]``; the attention projections (torch ``Linear``
``[O, I]``) → ``[I, O]``; GroupNorm gains and every bias unchanged. The mid-block attention
also reads the names of diffusers' deprecated attention block (``query`` / ``key`` /
``value`` / ``proj_attn``), which diffusers itself converts on load.

Loading goes through :mod:`ditax.io.convert` (every key and every shape checked against the
folder's ``config.json`` before anything is read; one :class:`~ditax.errors.WeightError`).
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from ditax.io import convert
from ditax.models.common.components import component_config
from ditax.models.vae.kl.config import FluxVAEConfig
from ditax.models.vae.kl.model import FluxVAE

CLASS_NAME = "AutoencoderKL"
_DEPRECATED = (("to_q", "query"), ("to_k", "key"), ("to_v", "value"), ("to_out.0", "proj_attn"))


def _row(path: tuple, ndim: int) -> convert.Row:
    names = tuple(str(p) for p in path)
    linear = names[-1] == "kernel"                          # nn.Linear: torch [O, I]
    key = ".".join(names[:-1] + ("weight",) if linear else names)
    alt = tuple(key.replace(f".{new}.", f".{old}.") for new, old in _DEPRECATED
                if ".attentions." in key and f".{new}." in key)
    transform = convert.TRANSPOSE if linear else convert.CONV2D if ndim == 4 else convert.ID
    return convert.Row(names, key, transform, alt=alt)


def weight_table(model: FluxVAE) -> convert.Table:
    """The VAE's table, from a (possibly abstract) :class:`FluxVAE`."""
    return convert.Table("VAE", tuple(
        _row(path, len(var.get_value().shape))
        for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param))))


def load_vae(path, dtype="float32", *, attention: str = "xla") -> FluxVAE:
    """Read a diffusers ``AutoencoderKL`` folder (``config.json`` +
    ``diffusion_pytorch_model.safetensors``, or a pipeline folder's ``vae/``) into a
    :class:`FluxVAE` with parameters in ``dtype`` (float32 or bfloat16)."""
    folder, raw = component_config(path, "vae", "VAE config", (CLASS_NAME,),
                                   "the FLUX.1 (or SD-style) VAE folder")
    cfg = FluxVAEConfig.from_diffusers(raw)
    jdtype = jnp.dtype(dtype)
    return convert.load_module(
        lambda: FluxVAE(cfg, dtype=jdtype, rngs=nnx.Rngs(0), attention=attention), weight_table,
        folder, jdtype)


__all__ = ["load_vae", "weight_table"]
