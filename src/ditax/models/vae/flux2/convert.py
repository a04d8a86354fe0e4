"""diffusers ``AutoencoderKLFlux2`` weights ↔ :class:`~ditax.models.vae.flux2.Flux2VAE`
parameters, and loading a FLUX.2 VAE folder.

The table is the KL VAE's (:func:`ditax.models.vae.kl.convert.weight_table`: the NNX parameter
path joined with dots is the diffusers key; convs ``[O, I, kh, kw]`` → ``[kh, kw, I, O]``,
attention projections transposed, norms and biases unchanged, the deprecated attention names
read too) plus the latent BatchNorm's ``bn.running_mean`` / ``bn.running_var`` unchanged.
``bn.num_batches_tracked`` (a training counter) may be present and is not read.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from ditax.io import convert
from ditax.models.common.components import component_config
from ditax.models.vae.flux2.config import Flux2VAEConfig
from ditax.models.vae.flux2.model import Flux2VAE
from ditax.models.vae.kl.convert import weight_table as kl_weight_table

CLASS_NAME = "AutoencoderKLFlux2"
_STATS = ("running_mean", "running_var")


def weight_table(model: Flux2VAE) -> convert.Table:
    """The VAE's table, from a (possibly abstract) :class:`Flux2VAE`."""
    stats = tuple(convert.Row(("bn", name), f"bn.{name}") for name in _STATS)
    return convert.Table("FLUX.2 VAE", kl_weight_table(model).rows + stats,
                         ignore=(r"^bn\.num_batches_tracked$",))


def load_flux2_vae(path, dtype="float32", *, attention: str = "xla") -> Flux2VAE:
    """Read a diffusers ``AutoencoderKLFlux2`` folder (``config.json`` +
    ``diffusion_pytorch_model.safetensors``, or a FLUX.2 pipeline folder's ``vae/``) into a
    :class:`Flux2VAE` with parameters and BatchNorm statistics in ``dtype`` (float32 or
    bfloat16). The config is checked before anything is built; every key and shape before
    anything is read."""
    folder, raw = component_config(path, "vae", "VAE config", (CLASS_NAME,),
                                   "a FLUX.2 VAE folder (FLUX.1's AutoencoderKL loads with "
                                   "ditax.models.vae.kl.load_vae)")
    cfg = Flux2VAEConfig.from_diffusers(raw)
    jdtype = jnp.dtype(dtype)
    return convert.load_module(
        lambda: Flux2VAE(cfg, dtype=jdtype, rngs=nnx.Rngs(0), attention=attention),
        weight_table, folder, jdtype)


__all__ = ["CLASS_NAME", "load_flux2_vae", "weight_table"]
