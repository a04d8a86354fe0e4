"""Parallel (row-split) VAE decode and encode over a mesh: the public entry.

``decode(vae, latents, mesh=mesh)`` / ``encode(vae, x, mesh=mesh)`` split every frame's rows
(height) over all of the mesh's devices, so per-device activation memory falls with the device
count, and return what the VAE's own one-device ``decode`` / ``encode`` returns (same layouts,
equal up to float rounding). Convolutions exchange halos with the neighbouring devices, norms
with whole-frame statistics share them (``psum``), attention gathers the frame's keys
(:mod:`ditax.nn.halo`); video VAEs keep their clip-by-clip streaming, so memory does not grow
with the frame count either. Heights need not divide by the device count.

Supported: the Wan 2.1 / 2.2 VAE (:mod:`.wan_parallel`), the image KL VAE of FLUX.1 and
SD-style models (:mod:`.kl_parallel`) and LTX-2's video VAE (:mod:`.ltx2_parallel`: the whole
clip at once, as its one-device decode; reflection-padded frame edges mirrored).
"""

from __future__ import annotations

import jax

from ditax.errors import RequestError
from ditax.models.vae import kl_parallel, ltx2_parallel, wan_parallel
from ditax.models.vae.kl.model import FluxVAE
from ditax.models.vae.ltx2.model import LTX2VideoVAE
from ditax.models.vae.wan.model import WanVAE

MODES = ("spatial",)

_IMPLS = ((WanVAE, wan_parallel), (FluxVAE, kl_parallel), (LTX2VideoVAE, ltx2_parallel))


def _impl(vae, parallel: str, what: str):
    if parallel not in MODES:
        raise RequestError(f"{what}: parallel={parallel!r} is not a parallel VAE mode; use one "
                           f"of {MODES}.")
    for cls, impl in _IMPLS:
        if isinstance(vae, cls):
            return impl
    names = ", ".join(cls.__name__ for cls, _ in _IMPLS)
    raise RequestError(f"{what}: no row-split program for {type(vae).__name__} (supported: "
                       f"{names}); decode it on one device (mesh=None) or tiled.")


def decode(vae, latents: jax.Array, *conditions, mesh, parallel: str = "spatial") -> jax.Array:
    """The VAE's ``decode(latents, *conditions)`` with rows split over ``mesh`` (Wan: ``[B, z,
    F, Y, X]`` → video ``[B, 3, F', sY, sX]`` clipped to [-1, 1]; KL: ``[B, C, Y, X]`` →
    unclipped image; LTX-2: ``[B, C, F, Y, X]`` and its decode timestep → unclipped video)."""
    return _impl(vae, parallel, "parallel VAE decode").decode(vae, latents, mesh, *conditions)


def decode_on(vae, latents: jax.Array, mesh=None, *conditions, **one_device) -> jax.Array:
    """The pipelines' decode: rows split over ``mesh`` (:func:`decode`), or with ``mesh``
    None the VAE's own ``decode(latents, *conditions, **one_device)`` (``tiled=``,
    ``programs=``); ``conditions``: the decode's further inputs (LTX-2's timestep)."""
    if mesh is None:
        return vae.decode(latents, *conditions, **one_device)
    return decode(vae, latents, *conditions, mesh=mesh)


def encode_moments(vae, x: jax.Array, *, mesh, parallel: str = "spatial"
                   ) -> tuple[jax.Array, jax.Array]:
    """The VAE's ``encode_moments(x)`` (posterior mean, clamped log-variance) with rows split."""
    return _impl(vae, parallel, "parallel VAE encode").encode_moments(vae, x, mesh)


def encode(vae, x: jax.Array, *, mesh, parallel: str = "spatial") -> jax.Array:
    """The VAE's ``encode(x)`` (posterior mean) with rows split over ``mesh``."""
    return encode_moments(vae, x, mesh=mesh, parallel=parallel)[0]


__all__ = ["MODES", "decode", "decode_on", "encode", "encode_moments"]
