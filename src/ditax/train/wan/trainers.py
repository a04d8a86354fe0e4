"""The Wan family's trainers as :class:`~ditax.models.base.FamilyTrainer` s (what
``ditax train-vae`` and ``ditax config --vae`` call, found through the family's ``trainers``)."""

from __future__ import annotations

from ditax.errors import ConfigError
from ditax.models.base import FamilyTrainer
from ditax.train.wan.vae_config import VAETrainConfig


class WanVAETraining(FamilyTrainer):
    """The Wan VAE (diffusers ``AutoencoderKLWan``) trained on a folder of clips
    (:func:`ditax.train.wan.vae.train_vae`)."""

    config_class = VAETrainConfig

    def load_config(self, config, overrides, listing: bool = False) -> VAETrainConfig:
        from ditax.train.wan.vae_config import load_vae_config

        return load_vae_config(config, overrides, require_source=not listing)

    def check_devices(self, cfg, devices: int) -> None:
        from ditax.train.wan.vae import check_devices

        check_devices(cfg, devices)

    def train(self, cfg, *, devices, progress: bool = True):
        from ditax.train.wan.vae import ClipError, train_vae

        try:
            return train_vae(cfg, devices=devices, progress=progress)
        except ClipError as e:              # the clip folder is the user's to fix
            raise ConfigError(str(e)) from e


__all__ = ["WanVAETraining"]
