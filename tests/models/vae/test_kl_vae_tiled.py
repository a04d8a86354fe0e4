"""Flux VAE tiling: a tiny random diffusers AutoencoderKL with small tiles (sample_size 16 px =
8 latent px, stride 6 latent / 12 px, blends of 4 px / 2 latent px) on inputs larger than a
tile — ditax's tiled encode / decode equal diffusers' enable_tiling() ones, and each compiled
program runs on one tile at most. The decode runs a 2-D grid of tiles (both blends); the encode
one row (the same stitching, its own tile arithmetic), which keeps the compiles few."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

from ditax.models.vae.kl import model as vae_model  # noqa: E402
from flux_vae_reference import rel, saved_pair  # noqa: E402

TOL = 1e-5


@pytest.fixture(scope="module")
def flux(tmp_path_factory):
    return saved_pair("flux", tmp_path_factory.mktemp("flux_vae_tiled"))


def _spy(monkeypatch, name: str) -> list:
    """Record the spatial shape of every input the jitted program ``name`` is called with."""
    seen, program = [], getattr(vae_model, name)

    def spy(graphdef, state, x):
        seen.append(tuple(x.shape[1:3]))
        return program(graphdef, state, x)

    monkeypatch.setattr(vae_model, name, spy)
    return seen


def test_tiled_matches_diffusers_one_tile_at_a_time(flux, rng, monkeypatch):
    ref, vae = flux
    images = rng.uniform(-1, 1, (1, 3, 12, 40)).astype(np.float32)   # one row of pixel tiles
    z = rng.standard_normal((1, 16, 20, 28)).astype(np.float32)
    with torch.no_grad():
        plain = ref.decode(torch.from_numpy(z)).sample.numpy()
        ref.enable_tiling()
        try:
            enc = ref.encode(torch.from_numpy(images)).latent_dist
            dec = ref.decode(torch.from_numpy(z)).sample.numpy()
        finally:
            ref.disable_tiling()
    assert rel(plain, dec) > 1e-2          # the blends are not the identity: tiling is seen

    decoded = _spy(monkeypatch, "decode_program")
    got = np.asarray(vae.decode(z, tiled=True))
    assert got.shape == dec.shape == (1, 3, 40, 56)
    assert rel(got, dec) < TOL
    # latent starts 0, 6, 12, 18 (rows) x 0, 6, 12, 18, 24 (columns): 20 tiles of <= 8 x 8
    assert len(decoded) == 20 and max(map(max, decoded)) == 8

    encoded = _spy(monkeypatch, "encode_program")
    mean, logvar = vae.encode_moments(images, tiled=True)
    assert mean.shape == enc.mean.shape == (1, 16, 6, 20)
    assert rel(mean, enc.mean.numpy()) < TOL and rel(logvar, enc.logvar.numpy()) < TOL
    # pixel starts 0, 12, 24, 36 along the width: tiles 12 x 16, 12 x 16, 12 x 16, 12 x 4
    assert encoded == [(12, 16)] * 3 + [(12, 4)]

    # no larger than one tile: tiled=True is the plain program, as diffusers (8 x 8 is a tile
    # shape compiled above)
    small = z[:, :, :8, :8]
    np.testing.assert_array_equal(np.asarray(vae.decode(small, tiled=True)),
                                  np.asarray(vae.decode(small)))
