"""Training FLUX.2: the objective's FLUX.2 parts (the packed denoiser call).

The training latents of FLUX.2 are what its transformer reads one token per pixel of:
``x0 [B, C, 1, Y, X]`` with ``C = in_channels`` (128) — the VAE's 32-channel posterior
patchified 2 x 2 (``Flux2Pipeline._patchify_latents``) and normalised by the VAE's BatchNorm
statistics (``(z - bn.running_mean) / sqrt(bn.running_var + eps)``), as diffusers'
``train_dreambooth_lora_flux2*.py`` prepare them. The generic flow loss
(:mod:`ditax.train.loss`) mixes them with noise at ``σ``: ``x_t = (1 - σ) x0 + σ ε``, target
``ε - x0`` (the scripts' ``target = noise - model_input``). :func:`denoise` is FLUX.2's side:
``x_t`` flattened to tokens ``[B, Y·X, C]`` (``_pack_latents``), image position ids
``(0, row, col, 0)`` and text ids ``(0, 0, 0, token)`` (``_prepare_latent_ids`` /
``_prepare_text_ids``), the transformer fed ``σ = timestep / 1000`` (it scales by 1000
inside) and, for FLUX.2-dev, the guidance input held at ``flow.guidance`` (default
:data:`DEFAULT_GUIDANCE`, the scripts' ``--guidance_scale`` default); the prediction
reshaped back to the latents' layout. Every text token is attended (no padding mask), as the
pipelines sample.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ditax.errors import ConfigError, RequestError

DEFAULT_GUIDANCE = 3.5   # diffusers' train_dreambooth_lora_flux2.py --guidance_scale default


def image_ids(y: int, x: int) -> np.ndarray:
    """Position ids float32 ``[Y·X, 4]`` of the image tokens: ``(0, row, column, 0)``."""
    rows, cols = np.meshgrid(np.arange(y), np.arange(x), indexing="ij")
    zeros = np.zeros_like(rows)
    return np.stack([zeros, rows, cols, zeros], -1).reshape(-1, 4).astype(np.float32)


def text_ids(length: int) -> np.ndarray:
    """Position ids float32 ``[T, 4]`` of the text tokens: ``(0, 0, 0, token)``."""
    ids = np.zeros((length, 4), np.float32)
    ids[:, 3] = np.arange(length)
    return ids


def pack(z):
    """``[B, C, Y, X]`` → tokens ``[B, Y·X, C]`` (row-major)."""
    b, c, y, x = z.shape
    return z.reshape(b, c, y * x).transpose(0, 2, 1)


def unpack(tokens, y: int, x: int):
    """Tokens ``[B, Y·X, C]`` → ``[B, C, Y, X]``."""
    b, _, c = tokens.shape
    return tokens.transpose(0, 2, 1).reshape(b, c, y, x)


def denoise(module, latents, timestep, text, guidance: float | None):
    """The FLUX.2 prediction for the flow loss: latents ``[B, C, 1, Y, X]``, ``timestep [B]``
    (0..1000), text ``[B, T, Dt]``, ``guidance`` (a number for a model with a guidance
    embedding, else None) → ``[B, C, 1, Y, X]``."""
    cfg = module.cfg
    b, c, f, y, x = latents.shape
    if cfg.output_channels != cfg.in_channels or cfg.patch_size != 1:
        raise ConfigError(f"model.out_channels={cfg.out_channels}, patch_size="
                          f"{cfg.patch_size}: the flow loss compares the prediction with the "
                          f"latents token by token, so train a model with patch_size=1 whose "
                          f"output is its input's width")
    if f != 1 or c != cfg.in_channels:
        raise RequestError(f"FLUX.2 trains on still-image latents [C={cfg.in_channels}, 1, Y, "
                           f"X] (the VAE latents patchified 2x2); got {tuple(latents.shape[1:])}")
    g = None if guidance is None else jnp.full((b,), guidance, jnp.float32)
    out = module(pack(latents[:, :, 0]), text, timestep / jnp.float32(1000), image_ids(y, x),
                 text_ids(text.shape[1]), g)
    return unpack(out, y, x)[:, :, None]


__all__ = ["DEFAULT_GUIDANCE", "denoise", "image_ids", "pack", "text_ids", "unpack"]
