"""Row-split (spatially parallel) encode and decode of LTX-2's video VAE
(:class:`~ditax.models.vae.ltx2.model.LTX2VideoVAE`): every frame's rows split over the mesh's
devices (:mod:`.rowsplit`), the whole clip at once as the one-device decode runs it.

Nothing in this VAE reads across rows but its convolutions: its norms are per pixel (RMS over
the channels, the shortcut's LayerNorm), its up / down sampling and patching move pixels
within their own row block, and it has no attention. Each ``3 x 3 x 3`` convolution takes one
halo row from each neighbour (:func:`ditax.nn.halo.rows`); where the VAE pads a frame by
reflection (LTX-2's decoder), the rows beyond the frame's top and bottom edges are mirrored
rows, as ``jnp.pad(mode="reflect")`` makes them on one device. The results equal the one-device
:meth:`~LTX2VideoVAE.decode` / :meth:`~LTX2VideoVAE.encode_moments` (untiled) up to float
rounding; per-device activation memory falls with the device count.

Clips are channels-last ``[B, F, Y, X, C]``; the row axis is 2.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

from ditax.models.vae.ltx2.model import LTX2VideoVAE, split_moments
from ditax.models.vae.rowsplit import make_split, pad_rows, row_spec, sharded

ROW = 2  # rows of channels-last [B, F, Y, X, C]


@functools.partial(jax.jit, static_argnames=("graphdef", "mesh", "split"))
def decode_program(graphdef, state, z, timestep, *, mesh, split):
    """Padded latents ``[B, F', Y', X, C]`` (+ timestep ``[B]`` or None) → unclipped video
    ``[B, F, sY', sX, c]``, rows split."""
    rows = row_spec(split, ROW, 5)
    body = lambda state, z, t: nnx.merge(graphdef, state).decode_latents(z, t)  # noqa: E731
    return sharded(body, mesh, split, (P(), rows, P()), rows)(state, z, timestep)


@functools.partial(jax.jit, static_argnames=("graphdef", "mesh", "split"))
def encode_program(graphdef, state, x, *, mesh, split):
    """Padded video ``[B, F, sY', sX, c]`` → raw moments ``[B, F', Y', X, C + 1]``, rows split."""
    rows = row_spec(split, ROW, 5)
    body = lambda state, x: nnx.merge(graphdef, state).moments(x)  # noqa: E731
    return sharded(body, mesh, split, (P(), rows), rows)(state, x)


def decode(vae: LTX2VideoVAE, latents: jax.Array, mesh, timestep=None) -> jax.Array:
    """:meth:`LTX2VideoVAE.decode` (untiled) with rows split over ``mesh``'s devices: raw latents
    ``[B, C, F, Y, X]`` (+ ``timestep`` as there) → unclipped video ``[B, 3, F', sY, sX]``; any
    ``Y``."""
    vae._check_latents(latents)
    t = vae._timestep(timestep, latents.shape[0])
    y, s = latents.shape[3], vae.spatial_compression_ratio
    split = make_split(mesh, y, "LTX2VideoVAE parallel decode")
    z = pad_rows(jnp.transpose(jnp.asarray(latents, vae.dtype), (0, 2, 3, 4, 1)), split, 1, ROW)
    out = decode_program(*nnx.split(vae), z, t, mesh=mesh, split=split)
    return jnp.transpose(out[:, :, :y * s], (0, 4, 1, 2, 3))


def encode_moments(vae: LTX2VideoVAE, video: jax.Array, mesh) -> tuple[jax.Array, jax.Array]:
    """:meth:`LTX2VideoVAE.encode_moments` (untiled) with rows split over ``mesh``'s devices:
    video ``[B, 3, F, H, W]`` → (mean, log-variance) ``[B, C, F', H/s, W/s]``."""
    vae._check_video(video)
    s = vae.spatial_compression_ratio
    y = video.shape[3] // s
    split = make_split(mesh, y, "LTX2VideoVAE parallel encode")
    x = pad_rows(jnp.transpose(jnp.asarray(video, vae.dtype), (0, 2, 3, 4, 1)), split, s, ROW)
    h = encode_program(*nnx.split(vae), x, mesh=mesh, split=split)[:, :, :y]
    mean, logvar = split_moments(h)
    return jnp.transpose(mean, (0, 4, 1, 2, 3)), jnp.transpose(logvar, (0, 4, 1, 2, 3))


__all__ = ["decode", "decode_program", "encode_moments", "encode_program"]
