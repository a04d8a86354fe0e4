"""The Wan family's trainers as :class:`~ditax.models.base.FamilyTrainer` s (what
``ditax train-vae`` and ``ditax config --vae`` call, found through the family's ``trainers``)."""

from __future__ import annotations

from ditax.train.vae_training import VAETraining
from ditax.train.wan.vae import train_vae
from ditax.train.wan.vae_config import VAETrainConfig, load_vae_config


class WanVAETraining(VAETraining, config=VAETrainConfig, read=load_vae_config, run=train_vae):
    """The Wan VAE (diffusers ``AutoencoderKLWan``) trained on a folder of clips
    (:func:`ditax.train.wan.vae.train_vae`)."""


__all__ = ["WanVAETraining"]
