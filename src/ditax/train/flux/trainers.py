"""The Flux family's trainers as :class:`~ditax.models.base.FamilyTrainer` s (what
``ditax train-vae --family flux`` calls, found through the family's ``trainers``)."""

from __future__ import annotations

from ditax.errors import ConfigError
from ditax.models.base import FamilyTrainer
from ditax.train.flux.vae import FluxVAETrainConfig


class FluxVAETraining(FamilyTrainer):
    """The Flux VAE (diffusers ``AutoencoderKL``) trained on a folder of images
    (:func:`ditax.train.flux.vae.train_flux_vae`)."""

    config_class = FluxVAETrainConfig

    def load_config(self, config, overrides, listing: bool = False) -> FluxVAETrainConfig:
        from ditax.train.flux.vae import load_flux_vae_config

        return load_flux_vae_config(config, overrides, require_source=not listing)

    def check_devices(self, cfg, devices: int) -> None:
        from ditax.train.vae import check_devices

        check_devices(cfg, devices)

    def train(self, cfg, *, devices, progress: bool = True):
        from ditax.train.flux.vae import train_flux_vae
        from ditax.train.vae import ClipError

        try:
            return train_flux_vae(cfg, devices=devices, progress=progress)
        except ClipError as e:              # the image folder is the user's to fix
            raise ConfigError(str(e)) from e


__all__ = ["FluxVAETraining"]
