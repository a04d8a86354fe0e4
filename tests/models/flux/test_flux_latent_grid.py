"""``FluxFamily.latent_grid`` takes the VAE's factor from its config (2 per level but the last:
``2 ** (len(block_out_channels) - 1)``), as the VAE itself does; FLUX.1's 8 by default."""

import pytest

from ditax.errors import ConfigError
from ditax.models.flux.family import FluxFamily, vae_factor
from ditax.models.vae.kl.config import FluxVAEConfig


def test_latent_grid_follows_the_vae_depth():
    three = FluxVAEConfig(block_out_channels=(32, 64, 64), down_block_types=("D",) * 3,
                          up_block_types=("U",) * 3, norm_num_groups=32)
    assert vae_factor(three) == three.spatial_factor == 4
    assert FluxFamily.latent_grid(1, 64, 48, vae=three) == (1, 16, 12)
    assert FluxFamily.latent_grid(1, 64, 48, vae={"block_out_channels": [8, 16]}) == (1, 32, 24)
    assert FluxFamily.latent_grid(1, 1024, 768) == (1, 128, 96)      # FLUX.1: 8x
    with pytest.raises(ConfigError, match=r"64x36 must be multiples of 8 \(the VAE's 4x"):
        FluxFamily.latent_grid(1, 64, 36, vae=three)
    with pytest.raises(ConfigError, match="multiples of 16 .the VAE's 8x"):
        FluxFamily.latent_grid(1, 64, 40)
    with pytest.raises(ConfigError, match="no block_out_channels"):
        FluxFamily.latent_grid(1, 64, 64, vae={})
