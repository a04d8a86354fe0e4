"""What the test-defined toy families share: a :class:`~ditax.models.base.ModelFamily` base
over a config with ``channels`` and ``text_dim`` whose video encoder is a 4x spatial
patchify (latent ``(F, H/4, W/4)``), one token per latent pixel, parameters replicated.
Each toy test subclasses it with its own name, denoiser and FLOPs."""

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from ditax.errors import ConfigError
from ditax.models.base import ModelFamily


class ToyFamilyBase(ModelFamily):
    latent_channels = property(lambda self: self.model.channels)
    text_dim = property(lambda self: self.model.text_dim)

    @classmethod
    def latent_grid(cls, num_frames, height, width):
        if height % 4 or width % 4:
            raise ConfigError(f"height x width = {height}x{width} must be multiples of 4")
        return num_frames, height // 4, width // 4

    def tokens_per_sample(self, latent_shape):
        return int(np.prod(latent_shape[1:]))

    def param_shardings(self, params, mesh):
        return jax.tree.map(lambda _: NamedSharding(mesh, P()), params)
