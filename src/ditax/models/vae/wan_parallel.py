"""Row-split (spatially parallel) encode and decode of the Wan 2.1 / 2.2 VAE.

The same streaming as :class:`~ditax.models.vae.wan.WanVAE` (decoder: one latent frame a chunk;
encoder: the first frame, then ``temporal_factor`` frames a chunk; the causal feature cache
carried between chunks), with every chunk's frames split by rows over the mesh's devices
(:mod:`.rowsplit`): each device convolves its rows with one-row halos from its neighbours, the
mid block's attention sees the whole frame's keys, and the feature cache stays split by rows
on the devices. The results equal the one-device decode / encode up to float rounding.

Chunks are channels-last ``[B, f, Y, X, C]``; the row axis is 2.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

from ditax.models.vae.rowsplit import make_split, pad_rows, row_spec, sharded
from ditax.models.vae.wan.model import WanVAE
from ditax.models.vae.wan.shuffle import patchify, unpatchify

ROW = 2  # rows of channels-last [B, F, Y, X, C]


@functools.partial(jax.jit, static_argnames=("graphdef", "first", "mesh", "split"),
                   donate_argnames=("cache",))
def decode_chunk(graphdef, state, z, cache, *, first: bool, mesh, split):
    """:func:`ditax.models.vae.wan.chunks.decode_chunk` with rows split by ``split`` over
    ``mesh``: latent frame ``[B, 1, Y', X, z_dim]`` (``Y'`` padded rows) → (unclipped frames
    ``[B, f, Y' s/p, X s/p, C]`` before unpatchify, new cache; both split by rows)."""
    rows = row_spec(split, ROW, 5)

    def body(state, z, cache):
        vae = nnx.merge(graphdef, state)
        return vae.decoder(vae.post_quant_conv(z)[0], cache, first)

    return sharded(body, mesh, split, (P(), rows, rows), (rows, rows))(state, z, cache)


@functools.partial(jax.jit, static_argnames=("graphdef", "first", "mesh", "split"),
                   donate_argnames=("cache",))
def encode_chunk(graphdef, state, x, cache, *, first: bool, mesh, split):
    """:func:`ditax.models.vae.wan.chunks.encode_chunk` with rows split: (patchified) frames
    ``[B, f, H', W, C]`` → (moments ``[B, f', Y', X, 2 z_dim]``, new cache)."""
    rows = row_spec(split, ROW, 5)

    def body(state, x, cache):
        vae = nnx.merge(graphdef, state)
        h, cache = vae.encoder(x, cache, first)
        return vae.quant_conv(h)[0], cache

    return sharded(body, mesh, split, (P(), rows, rows), (rows, rows))(state, x, cache)


def decode(vae: WanVAE, z: jax.Array, mesh) -> jax.Array:
    """:meth:`WanVAE.decode` (untiled) with every frame's rows split over ``mesh``'s devices:
    latents ``[B, z_dim, F, Y, X]`` → video ``[B, C, 1 + 4 (F - 1), sY, sX]`` in [-1, 1]. Any
    ``Y`` works (padded to a multiple of the device count, cropped after)."""
    vae._check_latents(z)
    split = make_split(mesh, z.shape[3], "WanVAE parallel decode")
    sf, p = vae.scale_factor_spatial, vae.config.patch_size or 1
    x = pad_rows(jnp.transpose(jnp.asarray(z, vae.dtype), (0, 2, 3, 4, 1)), split, 1, ROW)
    graphdef, state = nnx.split(vae)
    step = functools.partial(decode_chunk, graphdef, mesh=mesh, split=split)
    out, cache = step(state, x[:, :1], None, first=True)
    outs = [out]
    for i in range(1, x.shape[1]):
        out, cache = step(state, x[:, i:i + 1], cache, first=False)
        outs.append(out)
    video = jnp.concatenate(outs, axis=1)
    if x.shape[2] != z.shape[3]:  # crop the padding rows (an aligned frame stays row-split)
        video = video[:, :, :z.shape[3] * (sf // p)]
    if p > 1:
        video = unpatchify(video, p)
    return jnp.transpose(jnp.clip(video, -1.0, 1.0), (0, 4, 1, 2, 3))


def encode_moments(vae: WanVAE, video: jax.Array, mesh) -> tuple[jax.Array, jax.Array]:
    """:meth:`WanVAE.encode_moments` with every frame's rows split over ``mesh``'s devices:
    video ``[B, C, F, H, W]`` → (mean, log-variance) ``[B, z_dim, F', H/s, W/s]``."""
    vae._check_video(video)
    sf, p = vae.scale_factor_spatial, vae.config.patch_size or 1
    y = video.shape[3] // sf
    split = make_split(mesh, y, "WanVAE parallel encode")
    x = jnp.transpose(jnp.asarray(video, vae.dtype), (0, 2, 3, 4, 1))
    if p > 1:
        x = patchify(x, p)
    x = pad_rows(x, split, sf // p, ROW)
    graphdef, state = nnx.split(vae)
    step = functools.partial(encode_chunk, graphdef, mesh=mesh, split=split)
    h, cache = step(state, x[:, :1], None, first=True)
    outs = [h]
    tf = vae.scale_factor_temporal
    for i in range(1, x.shape[1], tf):
        h, cache = step(state, x[:, i:i + tf], cache, first=False)
        outs.append(h)
    h = jnp.concatenate(outs, axis=1)[:, :, :y]
    mean, logvar = jnp.split(jnp.transpose(h, (0, 4, 1, 2, 3)), 2, axis=1)
    return mean, jnp.clip(logvar, -30.0, 20.0)


__all__ = ["decode", "decode_chunk", "encode_chunk", "encode_moments"]
