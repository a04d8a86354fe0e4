"""Wan's own trainers beside the model-agnostic ``ditax.train``: the Wan VAE
(:mod:`ditax.train.wan.vae`, its config :mod:`ditax.train.wan.vae_config`), declared by the Wan
family's :meth:`~ditax.models.base.ModelFamily.trainers` and entered through
:class:`ditax.train.wan.trainers.WanVAETraining` (``ditax train-vae``)."""
