"""Row-split (spatially parallel) VAE decode and encode (ditax.models.vae.parallel) on 2, 4 and 8
fake CPU devices against the same VAE's one-device decode / encode: Wan 2.1, Wan 2.2, the Flux
KL VAE and LTX-2's video VAE (reflection-padded rows), tiny random models, heights that do not
divide by the device count (padding rows must never reach a real row), two-axis meshes (the
split runs over all axes together)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh

from ditax.errors import RequestError
from ditax.models.vae import parallel
from ditax.models.vae.kl import FluxVAE, FluxVAEConfig
from ditax.models.vae.wan import WanVAE, WanVAEConfig
from shared_inputs import randomise

TOL = 1e-5

WAN21 = dict(base_dim=8, z_dim=4, dim_mult=(1, 2, 2, 2), num_res_blocks=1,
             temperal_downsample=(False, True, True))
WAN22 = dict(base_dim=8, decoder_base_dim=12, z_dim=8, dim_mult=(1, 2, 2, 2), num_res_blocks=1,
             temperal_downsample=(False, True, True), is_residual=True, patch_size=2,
             in_channels=12, out_channels=12, scale_factor_spatial=16)
KL = dict(block_out_channels=(8, 8, 16), layers_per_block=1, norm_num_groups=4,
          latent_channels=4, down_block_types=("DownEncoderBlock2D",) * 3,
          up_block_types=("UpDecoderBlock2D",) * 3, sample_size=16)


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _mesh(shape):
    n = int(np.prod(shape))
    names = ("a", "b")[:len(shape)]
    return Mesh(np.array(jax.devices()[:n]).reshape(shape), names)


@pytest.fixture(scope="module")
def wan21():
    return randomise(WanVAE(WanVAEConfig(**WAN21), rngs=nnx.Rngs(0)), 1)


@pytest.fixture(scope="module")
def wan22():
    return randomise(WanVAE(WanVAEConfig(**WAN22), rngs=nnx.Rngs(2)), 3)


@pytest.fixture(scope="module")
def kl():
    return randomise(FluxVAE(FluxVAEConfig(**KL), rngs=nnx.Rngs(4)), 5)


def _check(got, want):
    assert got.shape == want.shape
    err = _rel(got, want)
    assert err < TOL, err
    return err


# Wan 2.1 streams two chunks each way (the first and one later chunk: the row-split feature
# cache carried between them); Wan 2.2 one chunk (its later chunks differ from 2.1's only in
# row-local time rearrangements), which saves four compiles.
@pytest.mark.parametrize("name,mesh_shape,y,chunks", [("wan21", (2, 4), 5, 2), ("wan22", (4,), 3, 1)])
def test_wan_decode_encode_match_one_device(name, mesh_shape, y, chunks, request):
    vae = request.getfixturevalue(name)
    mesh = _mesh(mesh_shape)
    k1, k2 = jax.random.split(jax.random.key(7))
    z = jax.random.normal(k1, (1, vae.z_dim, chunks, y, 3))
    _check(parallel.decode(vae, z, mesh=mesh), vae.decode(z))
    s, frames = vae.scale_factor_spatial, 1 + 4 * (chunks - 1)
    video = jax.random.uniform(k2, (1, 3, frames, y * s, 2 * s), minval=-1, maxval=1)
    mean, logvar = parallel.encode_moments(vae, video, mesh=mesh)
    want_mean, want_logvar = vae.encode_moments(video)
    _check(mean, want_mean)
    _check(logvar, want_logvar)


@pytest.mark.parametrize("mesh_shape,y", [((8,), 5), ((2,), 3)])
def test_kl_decode_encode_match_one_device(kl, mesh_shape, y):
    mesh = _mesh(mesh_shape)
    k1, k2 = jax.random.split(jax.random.key(9))
    z = jax.random.normal(k1, (2, 4, y, 3))
    _check(parallel.decode(kl, z, mesh=mesh), kl.decode(z))
    images = jax.random.uniform(k2, (1, 3, 4 * y, 8), minval=-1, maxval=1)
    _check(parallel.encode(kl, images, mesh=mesh), kl.encode(images))


def test_errors(kl):
    z = jnp.zeros((1, 4, 3, 3))
    with pytest.raises(RequestError, match="Mesh"):
        parallel.decode(kl, z, mesh=None)
    with pytest.raises(RequestError, match="parallel='tiles'"):
        parallel.decode(kl, z, mesh=_mesh((2,)), parallel="tiles")
    with pytest.raises(RequestError, match="no row-split program for object"):
        parallel.decode(object(), z, mesh=_mesh((2,)))


@pytest.fixture(scope="module")
def ltx2_vaes():
    """LTX-2.0's decoder (reflection padding, timestep-conditioned, residual upsamplers) and
    LTX-2.3's (zero padding), tiny and random."""
    from ltx2_vae_reference import CONFIGS

    from ditax.models.vae.ltx2 import LTX2VideoVAE, LTX2VideoVAEConfig

    return {name: randomise(LTX2VideoVAE(LTX2VideoVAEConfig.from_diffusers(CONFIGS[name]),
                                          rngs=nnx.Rngs(6)), 7)
            for name in ("ltx2", "ltx23")}


# LTX-2.0: rows 5 on 4 devices (two padding rows, the bottom reflection falls inside a device)
# and rows 3 on 3 (every device an edge or next to one); LTX-2.3 zero padding, and the encoder
@pytest.mark.parametrize("name,mesh_shape,y", [("ltx2", (4,), 5), ("ltx2", (3,), 3),
                                               ("ltx23", (2,), 3)])
def test_ltx2_decode_matches_one_device(ltx2_vaes, name, mesh_shape, y):
    vae = ltx2_vaes[name]
    mesh = _mesh(mesh_shape)
    k1, k2 = jax.random.split(jax.random.key(11))
    z = jax.random.normal(k1, (1, vae.latent_channels, 2, y, 2))
    t = 0.05 if vae.timestep_conditioning else None
    _check(parallel.decode(vae, z, t, mesh=mesh), vae.decode(z, t))
    if name == "ltx23":
        s = vae.spatial_compression_ratio
        video = jax.random.uniform(k2, (1, 3, 5, y * s, 2 * s), minval=-1, maxval=1)
        mean, logvar = parallel.encode_moments(vae, video, mesh=mesh)
        want_mean, want_logvar = vae.encode_moments(video)
        _check(mean, want_mean)
        _check(logvar, want_logvar)
