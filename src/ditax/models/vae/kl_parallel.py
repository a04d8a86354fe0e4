"""Row-split (spatially parallel) encode and decode of the image KL VAE (FLUX.1's and SD-style
``AutoencoderKL``): the image's rows split over the mesh's devices (:mod:`.rowsplit`); 3x3
convolutions exchange one-row halos, GroupNorm takes its statistics over the whole image
(``psum``), the mid block's attention sees the whole image's keys. Equal to the one-device
:meth:`FluxVAE.decode` / :meth:`FluxVAE.encode_moments` up to float rounding.

Images are channels-last ``[B, Y, X, C]``; the row axis is 1.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

from ditax.models.vae.kl.model import FluxVAE, split_moments
from ditax.models.vae.rowsplit import make_split, pad_rows, row_spec, sharded

ROW = 1  # rows of channels-last [B, Y, X, C]


@functools.partial(jax.jit, static_argnames=("graphdef", "mesh", "split"))
def decode_program(graphdef, state, z, *, mesh, split):
    """Padded latents ``[B, Y', X, C]`` → unclipped image ``[B, sY', sX, C]``, rows split."""
    rows = row_spec(split, ROW, 4)
    body = lambda state, z: nnx.merge(graphdef, state).decode_latents(z)  # noqa: E731
    return sharded(body, mesh, split, (P(), rows), rows)(state, z)


@functools.partial(jax.jit, static_argnames=("graphdef", "mesh", "split"))
def encode_program(graphdef, state, x, *, mesh, split):
    """Padded image ``[B, sY', sX, C]`` → moments ``[B, Y', X, 2 C_latent]``, rows split."""
    rows = row_spec(split, ROW, 4)
    body = lambda state, x: nnx.merge(graphdef, state).moments(x)  # noqa: E731
    return sharded(body, mesh, split, (P(), rows), rows)(state, x)


def decode(vae: FluxVAE, latents: jax.Array, mesh) -> jax.Array:
    """:meth:`FluxVAE.decode` (untiled) with rows split over ``mesh``'s devices: latents
    ``[B, C, Y, X]`` → image ``[B, C_out, sY, sX]`` (unclipped); any ``Y``."""
    vae._check_latents(latents)
    y, s = latents.shape[2], vae.scale_factor_spatial
    split = make_split(mesh, y, "FluxVAE parallel decode")
    z = pad_rows(jnp.transpose(jnp.asarray(latents, vae.dtype), (0, 2, 3, 1)), split, 1, ROW)
    out = decode_program(*nnx.split(vae), z, mesh=mesh, split=split)
    return jnp.transpose(out[:, :y * s], (0, 3, 1, 2))


def encode_moments(vae: FluxVAE, images: jax.Array, mesh) -> tuple[jax.Array, jax.Array]:
    """:meth:`FluxVAE.encode_moments` with rows split over ``mesh``'s devices: images
    ``[B, C, H, W]`` → (mean, log-variance clamped) ``[B, C_latent, H/s, W/s]``."""
    vae._check_images(images)
    s = vae.scale_factor_spatial
    y = images.shape[2] // s
    split = make_split(mesh, y, "FluxVAE parallel encode")
    x = pad_rows(jnp.transpose(jnp.asarray(images, vae.dtype), (0, 2, 3, 1)), split, s, ROW)
    h = encode_program(*nnx.split(vae), x, mesh=mesh, split=split)[:, :y]
    mean, logvar = split_moments(h)
    return jnp.transpose(mean, (0, 3, 1, 2)), jnp.transpose(logvar, (0, 3, 1, 2))


__all__ = ["decode", "decode_program", "encode_moments", "encode_program"]
