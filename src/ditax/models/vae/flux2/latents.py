"""FLUX.2's latent space between the VAE and the transformer: patchify / unpatchify, and the
normalisation by the VAE's latent BatchNorm statistics.

The FLUX.2 pipelines (``Flux2Pipeline``, ``Flux2KleinPipeline``) never run the BatchNorm as a
layer; they read its running statistics. An encoded image's latents ``[B, C, Y, X]`` are
patchified to ``[B, C·p·q, Y/p, X/q]`` (``patch_size`` ``(p, q)`` = (2, 2): channel
``c·p·q + i·q + j`` holds pixel ``(i, j)`` of each patch of channel ``c``) and normalised
``(z - running_mean) / sqrt(running_var + eps)`` per patchified channel; before decoding, the
transformer's latents go the other way: ``z · sqrt(running_var + eps) + running_mean``, then
unpatchify. The statistics are cast to the latents' dtype after the square root, as there.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.errors import RequestError


class LatentBatchNorm(nnx.Module):
    """diffusers' ``bn`` (``BatchNorm2d(channels, affine=False)``) of ``AutoencoderKLFlux2``:
    its ``running_mean`` / ``running_var`` ``[channels]`` (``nnx.BatchStat``: read from the
    checkpoint, not trained by gradient) and ``eps``. Initialised as torch does (0 / 1)."""

    def __init__(self, channels: int, eps: float, *, dtype):
        self.eps = float(eps)
        self.running_mean = nnx.BatchStat(jnp.zeros((channels,), dtype))
        self.running_var = nnx.BatchStat(jnp.ones((channels,), dtype))

    @property
    def channels(self) -> int:
        return self.running_mean.shape[0]

    def stats(self, dtype) -> tuple[jax.Array, jax.Array]:
        """(mean, std = sqrt(running_var + eps)), each ``[1, channels, 1, 1]`` in ``dtype``."""
        mean = self.running_mean[...].reshape(1, -1, 1, 1)
        std = jnp.sqrt(self.running_var[...] + self.eps).reshape(1, -1, 1, 1)
        return mean.astype(dtype), std.astype(dtype)

    def _check(self, z, what: str) -> jax.Array:
        z = jnp.asarray(z)
        if z.ndim != 4 or z.shape[1] != self.channels:
            raise RequestError(f"FLUX.2 VAE {what}: expected patchified latents "
                               f"[B, {self.channels}, Y, X], got shape {tuple(z.shape)}; "
                               "patchify the VAE's latents first (patchify_latents)")
        return z

    def normalize(self, z: jax.Array) -> jax.Array:
        """Patchified VAE latents ``[B, channels, Y, X]`` → the transformer's scale."""
        z = self._check(z, "normalize_latents")
        mean, std = self.stats(z.dtype)
        return (z - mean) / std

    def denormalize(self, z: jax.Array) -> jax.Array:
        """The transformer's latents ``[B, channels, Y, X]`` → patchified VAE latents."""
        z = self._check(z, "denormalize_latents")
        mean, std = self.stats(z.dtype)
        return z * std + mean


def patchify_latents(z: jax.Array, patch_size: tuple[int, int] = (2, 2)) -> jax.Array:
    """``[B, C, Y, X]`` → ``[B, C·p·q, Y/p, X/q]``: each ``p x q`` patch of a channel becomes
    ``p·q`` consecutive channels (row-major inside the patch), as the FLUX.2 pipelines'
    ``_patchify_latents``."""
    z = jnp.asarray(z)
    p, q = patch_size
    if z.ndim != 4 or z.shape[2] % p or z.shape[3] % q:
        raise RequestError(f"patchify_latents: expected latents [B, C, Y, X] with Y a multiple "
                           f"of {p} and X of {q}, got shape {tuple(z.shape)}; crop the image "
                           f"to a multiple of {p} x {q} latent pixels")
    b, c, y, x = z.shape
    z = z.reshape(b, c, y // p, p, x // q, q).transpose(0, 1, 3, 5, 2, 4)
    return z.reshape(b, c * p * q, y // p, x // q)


def unpatchify_latents(z: jax.Array, patch_size: tuple[int, int] = (2, 2)) -> jax.Array:
    """Inverse of :func:`patchify_latents`: ``[B, C·p·q, Y, X]`` → ``[B, C, Y·p, X·q]``."""
    z = jnp.asarray(z)
    p, q = patch_size
    if z.ndim != 4 or z.shape[1] % (p * q):
        raise RequestError(f"unpatchify_latents: expected [B, C·{p * q}, Y, X], got shape "
                           f"{tuple(z.shape)}; pass the patchified latents (channels a "
                           f"multiple of {p * q})")
    b, cpq, y, x = z.shape
    c = cpq // (p * q)
    z = z.reshape(b, c, p, q, y, x).transpose(0, 1, 4, 2, 5, 3)
    return z.reshape(b, c, y * p, x * q)


__all__ = ["LatentBatchNorm", "patchify_latents", "unpatchify_latents"]
