"""The VAE trainer's colour term (``loss.colour``): the L1 of the error's means over
``colour_block`` x ``colour_block`` pixel squares, added to the loss with its weight; off by
default (the parts then as before); refused where the squares do not tile the crops."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from ditax.train.vae import reconstruction_losses
from ditax.train.vae_config import VAELossConfig


def test_colour_term_is_the_l1_of_block_mean_errors():
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (2, 1, 8, 12, 3)).astype(np.float32)      # [B, F, H, W, C]
    recon = x + rng.normal(0, 0.3, x.shape).astype(np.float32)
    mean = jnp.zeros((2, 4)); logvar = jnp.zeros((2, 4))
    off = VAELossConfig()
    base, parts = reconstruction_losses(jnp.asarray(recon), mean, logvar, jnp.asarray(x), off)
    assert set(parts) == {"l1", "mse", "kl"}
    on = dataclasses.replace(off, colour=2.0, colour_block=4)
    loss, parts = reconstruction_losses(jnp.asarray(recon), mean, logvar, jnp.asarray(x), on)
    err = (recon - x).astype(np.float64)
    want = np.abs(err.reshape(2, 1, 2, 4, 3, 4, 3).mean(axis=(3, 5))).mean()
    assert float(parts["colour"]) == pytest.approx(want, rel=1e-5)
    assert float(loss) == pytest.approx(float(base) + 2.0 * want, rel=1e-5)
    # a uniform colour shift is kept whole by the block means; zero-mean noise mostly cancels
    assert float(parts["colour"]) < 0.5 * float(parts["l1"])


def test_colour_block_must_tile_the_crops(tmp_path):
    from ditax.errors import ConfigError
    from ditax.train.flux.vae import load_flux_vae_config

    kw = {"data.source": "x", "data.height": 32, "data.width": 32, "loss.colour": 1.0}
    assert load_flux_vae_config(None, **kw, **{"loss.colour_block": 4}).loss.colour == 1.0
    with pytest.raises(ConfigError, match="loss.colour_block=3"):
        load_flux_vae_config(None, **kw, **{"loss.colour_block": 3})
    with pytest.raises(ConfigError, match="loss.colour=-1"):
        load_flux_vae_config(None, **dict(kw, **{"loss.colour": -1.0}))
