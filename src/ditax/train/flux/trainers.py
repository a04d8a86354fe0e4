"""The Flux family's trainers as :class:`~ditax.models.base.FamilyTrainer` s (what
``ditax train-vae --family flux`` calls, found through the family's ``trainers``)."""

from __future__ import annotations

from ditax.train.flux.vae import FluxVAETrainConfig, load_flux_vae_config, train_flux_vae
from ditax.train.vae_training import VAETraining


class FluxVAETraining(VAETraining, config=FluxVAETrainConfig, read=load_flux_vae_config,
                      run=train_flux_vae):
    """The Flux VAE (diffusers ``AutoencoderKL``) trained on a folder of images
    (:func:`ditax.train.flux.vae.train_flux_vae`)."""


__all__ = ["FluxVAETraining"]
