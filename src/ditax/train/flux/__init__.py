"""Flux's own trainers beside the model-agnostic ``ditax.train``: the Flux VAE (diffusers
``AutoencoderKL``, :mod:`ditax.train.flux.vae`) on the shared VAE trainer, declared by the Flux
family's :meth:`~ditax.models.base.ModelFamily.trainers` and entered through
:class:`ditax.train.flux.trainers.FluxVAETraining` (``ditax train-vae --family flux``)."""
