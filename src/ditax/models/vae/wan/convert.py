"""diffusers ``AutoencoderKLWan`` weights ↔ :class:`~ditax.models.vae.wan.WanVAE` parameters.

The table is derived from the model: an NNX parameter path joined with dots is the diffusers
key, except that ``resample_conv`` is diffusers' ``resample.1`` (the conv inside an
``nn.Sequential``). The transform follows from our parameter (torch layout → ours):

- 5-D conv ``[O, I, kt, kh, kw]`` → ``[kt, kh, kw, I, O]``; 4-D conv ``[O, I, kh, kw]`` →
  ``[kh, kw, I, O]``; a 1x1 conv into a 2-D ``Dense`` → ``[I, O]``
- RMS gain ``gamma`` ``[C, 1, 1]`` (attention blocks) or ``[C, 1, 1, 1]`` (others) → ``[C]``
- 1-D bias → unchanged

The same derivation covers the Wan 2.2 VAE (``is_residual``): its levels' ``resnets``,
``downsampler`` / ``upsampler`` (one ``Resample``, not a list as in 2.1) are attribute paths like
the others, and the pooled / duplicated shortcuts (diffusers ``avg_shortcut``) hold no tensors.

Loading and export go through :mod:`ditax.io.convert` (key check, shape check on every tensor,
one :class:`~ditax.errors.WeightError`).
"""

from __future__ import annotations


import jax.numpy as jnp
from flax import nnx

from ditax.io import convert
from ditax.io.files import read_model_json
from ditax.io.hub import resolve_folder
from ditax.models.vae.wan import WanVAE, WanVAEConfig

_RENAMES = (("resample_conv", "resample.1"),)
_CONVS = {5: convert.CONV3D, 4: convert.CONV2D, 2: convert.POINTWISE}


def diffusers_key(path: tuple) -> str:
    """NNX parameter path → diffusers state-dict key."""
    key = ".".join(str(p) for p in path)
    for ours, theirs in _RENAMES:
        key = key.replace(ours, theirs)
    return key


def _transform(key: str, ndim: int) -> convert.Transform:
    if key.endswith(".gamma"):  # torch keeps RMS gains broadcastable over [C, (F,) Y, X]
        return convert.unit_axes(2 if ".attentions." in key else 3)
    return _CONVS.get(ndim, convert.ID)


def weight_table(model) -> convert.Table:
    """The VAE's table, from a (possibly abstract) :class:`WanVAE`."""
    rows = []
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        key = diffusers_key(path)
        rows.append(convert.Row(tuple(str(p) for p in path), key,
                                _transform(key, len(var.get_value().shape))))
    return convert.Table("VAE", tuple(rows))


def load_vae(path, dtype="float32") -> WanVAE:
    """Read a diffusers ``AutoencoderKLWan`` folder (or a pipeline's ``vae/``) into a
    :class:`WanVAE` with params in ``dtype``."""
    folder = resolve_folder(path, "vae")
    cfg = WanVAEConfig.from_diffusers(read_model_json(folder / "config.json", "VAE config"))
    jdtype = jnp.dtype(dtype)
    return convert.load_module(lambda: WanVAE(cfg, dtype=jdtype, rngs=nnx.Rngs(0)), weight_table, folder, jdtype)
