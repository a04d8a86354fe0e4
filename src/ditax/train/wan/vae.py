"""``ditax train-vae``: train a Wan VAE (diffusers ``AutoencoderKLWan``) on clips — the Wan
family's VAE trainer (:class:`ditax.train.wan.trainers.WanVAETraining`) on the shared VAE
training machinery (:mod:`ditax.train.vae`: clip bank, train step, run loop, resume).

The forward is the VAE's own streaming path — the first frame, then ``temporal_factor``
frames at a time through the encoder, one latent frame at a time through the decoder, the
causal feature cache carried between chunks — so what is trained is exactly what ``encode``
/ ``decode`` run at inference. The written folder's ``latents_mean`` / ``latents_std`` are
measured on the training clips' posterior means, so normalised latents have zero mean and
unit variance per channel.
"""

from __future__ import annotations

import dataclasses
import pathlib

import jax
import numpy as np

from ditax.models.vae.wan import WanVAE, WanVAEConfig
from ditax.train import vae as shared
from ditax.train.vae import (VAE_RESUME_POLICY, VAETrainResult, check_devices, psnr,
                             reconstruction_losses)
from ditax.train.vae_clips import ClipBank, ClipError
from ditax.train.wan.vae_config import VAETrainConfig


def to_video(clips_u8: np.ndarray) -> np.ndarray:
    """uint8 ``[N, F, H, W, 3]`` → float32 ``[N, 3, F, H, W]`` in [-1, 1] (the VAE's layout)."""
    return clips_u8.transpose(0, 4, 1, 2, 3).astype(np.float32) / 127.5 - 1.0


def vae_losses(vae: WanVAE, x: jax.Array, key: jax.Array, loss_cfg) -> tuple[jax.Array, dict]:
    """Loss and its parts for channels-last clips ``x`` ``[B, F, H, W, 3]`` in [-1, 1]."""
    recon, mean, logvar = vae.autoencode(x, key)
    return reconstruction_losses(recon, mean, logvar, x, loss_cfg)


def diffusers_config(c: WanVAEConfig) -> dict:
    """``AutoencoderKLWan`` ``config.json`` for ``c``."""
    return shared.diffusers_config(c, VAETrainer.diffusers_class)


class VAETrainer(shared.VAETrainer):
    """The Wan VAE on the shared trainer (:class:`ditax.train.vae.VAETrainer`)."""

    vae_class, diffusers_class = WanVAE, "AutoencoderKLWan"

    def load_init(self, cfg: VAETrainConfig) -> WanVAE:
        """The weights of the diffusers VAE folder ``cfg.init_from``, whose architecture must
        be ``cfg.vae``'s (latent statistics aside)."""
        from ditax.models.vae.wan.convert import load_vae

        vae = load_vae(cfg.init_from)
        arch = dataclasses.replace(vae.config, latents_mean=(), latents_std=())
        want = dataclasses.replace(cfg.vae, latents_mean=(), latents_std=())
        if arch != want:
            raise ValueError(f"init_from={cfg.init_from!r} holds a VAE of another architecture "
                             f"({arch}) than vae.* ({want}); set vae.* to match it")
        # the run's vae.* (the folder's latent statistics are not used in training and are
        # measured anew at the end): the graph of a VAE built from vae.*, so a trainer of
        # either kind may share the other's programs (programs_from)
        vae.config = cfg.vae
        return vae

    def init_posterior(self, vae: WanVAE, logvar: float) -> None:
        z = self.cfg.vae.z_dim
        bias = vae.quant_conv.bias
        bias[...] = bias[...].at[z:].set(logvar)

    def autoencode(self, vae: WanVAE, x, key):
        recon, mean, logvar = vae.autoencode(x, key)
        return recon, mean, logvar, x

    to_input = staticmethod(to_video)

    def decode(self, vae: WanVAE, z):
        return vae.decode(z)

    def write_folder(self, folder, params, mean, std, dtype="float32") -> pathlib.Path:
        """The trained VAE as a diffusers ``AutoencoderKLWan`` folder with the measured stats."""
        from ditax.models.vae.wan.convert import weight_table

        cfg = dataclasses.replace(self.cfg.vae,
                                  latents_mean=tuple(float(m) for m in mean),
                                  latents_std=tuple(float(s) for s in std))
        return self.save_folder(folder, params, cfg, weight_table, dtype)


def latent_stats(trainer: VAETrainer, params, clips_u8: np.ndarray, batch: int = 4,
                 max_clips: int = 128):
    """Per-channel mean and std of the posterior means of the first ``max_clips`` clips."""
    return trainer.latent_stats(params, clips_u8, batch, max_clips)


def write_vae_folder(folder, trainer: VAETrainer, params, mean, std,
                     dtype="float32") -> pathlib.Path:
    """The trained VAE as a diffusers ``AutoencoderKLWan`` folder with the measured stats."""
    return trainer.write_folder(folder, params, mean, std, dtype)


def train_vae(cfg: VAETrainConfig, *, devices=None, progress: bool = True, say=shared._say,
              bank: ClipBank | None = None, trainer: VAETrainer | None = None) -> VAETrainResult:
    """:func:`ditax.train.vae.train_vae` with the Wan VAE (see there for ``trainer``)."""
    return shared.train_vae(cfg, VAETrainer, devices=devices, progress=progress, say=say,
                            bank=bank, trainer=trainer)


__all__ = ["VAETrainer", "VAETrainResult", "ClipBank", "ClipError", "VAE_RESUME_POLICY",
           "check_devices", "train_vae", "psnr", "vae_losses", "latent_stats",
           "write_vae_folder", "diffusers_config", "to_video"]
