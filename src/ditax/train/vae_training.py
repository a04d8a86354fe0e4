"""A family's VAE trainer as a :class:`~ditax.models.base.FamilyTrainer` (what ``ditax
train-vae`` and ``ditax config --vae`` call), from the family's data only: its trainer config
class, the function that reads and checks that config, and the function that trains.

Every family's VAE trains on the shared trainer (:mod:`ditax.train.vae`), so the rules around
it are one: the batch must split over the devices, and a clip / image folder that cannot be
read is the user's to fix (a :class:`~ditax.errors.ConfigError`, exit 2), not a crash.
"""

from __future__ import annotations

from typing import Callable, ClassVar

from ditax.errors import ConfigError
from ditax.models.base import FamilyTrainer
from ditax.train.vae import check_devices
from ditax.train.vae_clips import ClipError


class VAETraining(FamilyTrainer):
    """A family's VAE trainer, declared with its data as class keywords::

        class WanVAETraining(VAETraining, config=VAETrainConfig, read=load_vae_config,
                             run=train_vae):

    ``config``: the trainer config dataclass (``ditax config --vae`` lists it);
    ``read(path, overrides, require_source=...)`` → a checked config; ``run(cfg,
    devices=..., progress=...)`` → the run's result.
    """

    config_class: ClassVar[type]
    read_config: ClassVar[Callable]
    run: ClassVar[Callable]

    def __init_subclass__(cls, *, config: type, read: Callable, run: Callable, **kw):
        super().__init_subclass__(**kw)
        cls.config_class = config
        cls.read_config, cls.run = staticmethod(read), staticmethod(run)

    def load_config(self, config, overrides, listing: bool = False):
        # a listing shows every key, so it does not need the data folder a run does
        return type(self).read_config(config, overrides, require_source=not listing)

    def check_devices(self, cfg, devices: int) -> None:
        check_devices(cfg, devices)

    def train(self, cfg, *, devices, progress: bool = True):
        try:
            return type(self).run(cfg, devices=devices, progress=progress)
        except ClipError as e:              # the clip / image folder is the user's to fix
            raise ConfigError(str(e)) from e


__all__ = ["VAETraining"]
