"""``ditax train-vae --family flux``: train a Flux VAE (diffusers ``AutoencoderKL``) on still
images (or one frame of clips) — the shared VAE trainer (:mod:`ditax.train.vae`) with the
Flux VAE's hooks.

Keys: ``vae.*`` are the diffusers ``AutoencoderKL`` config names
(:class:`~ditax.models.vae.kl.FluxVAEConfig`: ``block_out_channels``, ``layers_per_block``,
``latent_channels``, ``norm_num_groups`` …); ``data.*``, ``loss.*``, ``optim.*`` … as for
the Wan VAE (:mod:`ditax.train.vae_config`), with ``data.num_frames = data.crop_frames = 1``.
The written folder's ``shift_factor`` / ``scaling_factor`` are measured on the training
images' posterior means (mean and ``1 / std`` over every channel), so the latents the Flux
pipeline normalises, ``(z - shift) * scale``, have zero mean and unit variance.
"""

from __future__ import annotations

import dataclasses
import pathlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ditax.config.loader import load_dataclass
from ditax.models.vae.kl import FluxVAE, FluxVAEConfig
from ditax.train import vae as shared
from ditax.train.vae import VAETrainResult
from ditax.train.vae_clips import ClipBank
from ditax.train.vae_config import DEFAULTS as COMMON_DEFAULTS
from ditax.train.vae_config import VAERunConfig, check_vae_common


@dataclass(frozen=True)
class FluxVAETrainConfig(VAERunConfig):
    vae: FluxVAEConfig = field(default_factory=FluxVAEConfig)
    batch_size: int = 8
    output_dir: str = "out/flux_vae"


# a small VAE of FLUX.1's factor 8 and 16 channels (the dataclass defaults are the full
# FLUX.1 VAE), still images; applied key by key so that one override keeps the rest
DEFAULTS: dict[str, Any] = {"vae.block_out_channels": [16, 32, 64, 64],
                            "vae.layers_per_block": 1, "vae.norm_num_groups": 8,
                            "vae.sample_size": 64, "data.num_frames": 1,
                            "data.crop_frames": 1, **COMMON_DEFAULTS}


def check_flux_vae_training(c: FluxVAETrainConfig, require_source: bool = True) -> None:
    """Raise :class:`~ditax.errors.ConfigError` for a config that cannot run."""
    c.vae.validate()
    check_vae_common(c, c.vae.spatial_factor, 1, require_source)


def load_flux_vae_config(path: str | None = None, overrides: list[str] | None = None,
                         require_source: bool = True, **values) -> FluxVAETrainConfig:
    """A YAML file (optional), then ``values`` (dotted keys), then ``key=value`` texts → a
    checked :class:`FluxVAETrainConfig`."""
    cfg = load_dataclass(FluxVAETrainConfig, path, overrides, defaults=DEFAULTS, values=values)
    check_flux_vae_training(cfg, require_source)
    return cfg


def diffusers_config(c: FluxVAEConfig) -> dict:
    """``AutoencoderKL`` ``config.json`` for ``c`` (the sides of the one tile size)."""
    return shared.diffusers_config(c, FluxVAETrainer.diffusers_class)


class FluxVAETrainer(shared.VAETrainer):
    """The Flux VAE on the shared trainer: batches ``[B, 1, H, W, 3]`` train on their frame."""

    vae_class, diffusers_class = FluxVAE, "AutoencoderKL"

    def load_init(self, cfg: FluxVAETrainConfig) -> FluxVAE:
        from ditax.models.vae.kl import load_vae

        vae = load_vae(cfg.init_from)
        free = dict(scaling_factor=1.0, shift_factor=None)       # measured, not architecture
        if dataclasses.replace(vae.config, **free) != dataclasses.replace(cfg.vae, **free):
            raise ValueError(f"init_from={cfg.init_from!r} holds a VAE of another architecture "
                             f"({vae.config}) than vae.* ({cfg.vae}); set vae.* to match it")
        return vae

    def init_posterior(self, vae: FluxVAE, logvar: float) -> None:
        z = self.cfg.vae.latent_channels
        conv = vae.quant_conv if vae.quant_conv is not None else vae.encoder.conv_out
        conv.bias[...] = conv.bias[...].at[z:].set(logvar)

    def autoencode(self, vae: FluxVAE, x, key):
        frame = x[:, 0]                                        # [B, H, W, 3]
        recon, mean, logvar = vae.autoencode(frame, key)
        return recon, mean, logvar, frame

    @staticmethod
    def to_input(clips_u8: np.ndarray) -> np.ndarray:
        """uint8 ``[N, 1, H, W, 3]`` → float32 ``[N, 3, H, W]`` in [-1, 1]."""
        return clips_u8[:, 0].transpose(0, 3, 1, 2).astype(np.float32) / 127.5 - 1.0

    def decode(self, vae: FluxVAE, z):
        return vae.decode(z).clip(-1.0, 1.0)

    def write_folder(self, folder, params, mean, std, dtype="float32") -> pathlib.Path:
        from ditax.models.vae.kl.convert import weight_table

        shift = float(np.mean(mean))
        spread = float(np.sqrt(np.mean(std ** 2 + (mean - shift) ** 2)))
        cfg = dataclasses.replace(self.cfg.vae, shift_factor=shift, scaling_factor=1 / spread)
        return self.save_folder(folder, params, cfg, weight_table, dtype)


def train_flux_vae(cfg: FluxVAETrainConfig, *, devices=None, progress: bool = True,
                   say=shared._say, bank: ClipBank | None = None,
                   trainer: FluxVAETrainer | None = None) -> VAETrainResult:
    """:func:`ditax.train.vae.train_vae` with the Flux VAE."""
    return shared.train_vae(cfg, FluxVAETrainer, devices=devices, progress=progress, say=say,
                            bank=bank, trainer=trainer)


__all__ = ["FluxVAETrainConfig", "FluxVAETrainer", "load_flux_vae_config", "train_flux_vae",
           "diffusers_config"]
