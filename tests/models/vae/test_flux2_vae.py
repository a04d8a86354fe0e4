"""FLUX.2's VAE (diffusers AutoencoderKLFlux2): a tiny random model (decoder wider than the
encoder, perturbed norms / biases / BatchNorm statistics) saved with save_pretrained and loaded
with ditax — encode moments, sample and decode equal to diffusers at a non-square size, tiled
decode (a 2-D grid of tiles) and encode (one row) equal to diffusers' enable_tiling() ones, the
latent normalisation equal to the FLUX.2
pipelines' formula, the row-split decode on 8 devices equal to one device at an odd height, the
full-size layout equal to diffusers' keys and shapes, bfloat16 loading, one-line errors for bad
configs and folders."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

from flax import nnx  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

from ditax.errors import ConfigError, RequestError, WeightError  # noqa: E402
from ditax.io import convert  # noqa: E402
from ditax.models.vae import parallel  # noqa: E402
from ditax.models.vae.flux2 import Flux2VAE, Flux2VAEConfig, load_flux2_vae  # noqa: E402
from ditax.models.vae.flux2.convert import weight_table  # noqa: E402
from ditax.models.vae.kl import model as kl_model  # noqa: E402
from flux2_vae_reference import (TINY, pipeline_denormalize, pipeline_normalize,  # noqa: E402
                                 rel_err, saved_pair)

TOL = 1e-5


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    folder = tmp_path_factory.mktemp("flux2_vae")
    return (*saved_pair(folder), folder)


def test_encode_decode_match_diffusers(pair, rng):
    ref, vae, _ = pair
    images = rng.uniform(-1, 1, (2, 3, 12, 20)).astype(np.float32)
    with torch.no_grad():
        post = ref.encode(torch.from_numpy(images)).latent_dist
    mean, logvar = vae.encode_moments(images)
    assert mean.shape == logvar.shape == (2, 8, 6, 10)
    assert rel_err(mean, post.mean.numpy()) < TOL
    assert rel_err(logvar, post.logvar.numpy()) < TOL
    # the pipelines take the mode (sample_mode="argmax"), which is the mean
    np.testing.assert_array_equal(np.asarray(vae.encode(images)), np.asarray(mean))
    assert rel_err(vae.encode(images), post.mode().numpy()) < TOL
    # a draw is mean + std * N(0, 1) with diffusers' std (clamped log-variance)
    key = jax.random.key(3)
    eps = np.asarray(jax.random.normal(key, mean.shape, jnp.float32))
    draw = np.asarray(vae.sample(images, key))
    assert rel_err(draw, post.mean.numpy() + post.std.numpy() * eps) < TOL

    z = rng.standard_normal((2, 8, 6, 10)).astype(np.float32)
    with torch.no_grad():
        expect = ref.decode(torch.from_numpy(z)).sample.numpy()
    got = np.asarray(vae.decode(z))
    assert got.shape == expect.shape == (2, 3, 12, 20)
    assert rel_err(got, expect) < TOL


def test_tiled_matches_diffusers(pair, rng, monkeypatch):
    ref, vae, _ = pair
    z = rng.standard_normal((1, 8, 14, 20)).astype(np.float32)   # 3 x 4 tiles of <= 8 x 8
    images = rng.uniform(-1, 1, (1, 3, 12, 40)).astype(np.float32)   # one row of 4 pixel tiles
    with torch.no_grad():
        plain = ref.decode(torch.from_numpy(z)).sample.numpy()
        ref.enable_tiling()
        try:
            expect = ref.decode(torch.from_numpy(z)).sample.numpy()
            post = ref.encode(torch.from_numpy(images)).latent_dist
        finally:
            ref.disable_tiling()
    assert rel_err(plain, expect) > 1e-2          # the blends are not the identity

    mean, logvar = vae.encode_moments(images, tiled=True)   # moments blended after quant_conv
    assert mean.shape == post.mean.shape == (1, 8, 6, 20)
    assert rel_err(mean, post.mean.numpy()) < TOL and rel_err(logvar, post.logvar.numpy()) < TOL

    seen, program = [], kl_model.decode_program

    def spy(graphdef, state, x):
        seen.append(tuple(x.shape[1:3]))
        return program(graphdef, state, x)

    monkeypatch.setattr(kl_model, "decode_program", spy)
    got = np.asarray(vae.decode(z, tiled=True))
    assert got.shape == expect.shape == (1, 3, 28, 40)
    assert rel_err(got, expect) < TOL
    assert len(seen) == 12 and max(map(max, seen)) == 8    # one tile a program call


def test_latent_normalisation_matches_pipelines(pair, rng):
    ref, vae, _ = pair
    assert vae.batch_norm_eps == ref.config.batch_norm_eps == 0.05
    np.testing.assert_array_equal(np.asarray(vae.latents_bn_mean), ref.bn.running_mean.numpy())
    np.testing.assert_array_equal(np.asarray(vae.latents_bn_var), ref.bn.running_var.numpy())

    raw = rng.standard_normal((2, 8, 6, 10)).astype(np.float32)    # VAE latents
    got = vae.normalize_latents(vae.patchify_latents(raw))
    expect = pipeline_normalize(ref, torch.from_numpy(raw)).numpy()
    assert got.shape == expect.shape == (2, 32, 3, 5)
    assert rel_err(got, expect) < TOL

    tokens = rng.standard_normal((2, 32, 3, 5)).astype(np.float32)  # the transformer's, unpacked
    got = vae.unpatchify_latents(vae.denormalize_latents(tokens))
    expect = pipeline_denormalize(ref, torch.from_numpy(tokens)).numpy()
    assert got.shape == expect.shape == (2, 8, 6, 10)
    assert rel_err(got, expect) < TOL

    with pytest.raises(RequestError, match=r"patchified latents \[B, 32, Y, X\]"):
        vae.normalize_latents(raw)
    with pytest.raises(RequestError, match=r"denormalize and unpatchify"):
        vae.decode(tokens)


def test_row_split_decode_matches_one_device(pair, rng):
    _, vae, _ = pair
    mesh = Mesh(np.array(jax.devices()[:8]), ("a",))
    z = rng.standard_normal((1, 8, 7, 5)).astype(np.float32)   # 7 rows over 8 devices
    got = parallel.decode(vae, z, mesh=mesh)
    want = vae.decode(z)
    assert got.shape == want.shape == (1, 3, 14, 10)
    assert rel_err(got, want) < TOL


def test_flux2_layout_matches_diffusers():
    """Flux2VAEConfig() is diffusers' default (FLUX.2's VAE): the same keys and shapes as
    diffusers' model (built on the meta device, no weights); the counter is not read."""
    from diffusers import AutoencoderKLFlux2

    cfg = Flux2VAEConfig()
    assert (cfg.spatial_factor, cfg.tile_latent_min_size, cfg.bn_channels) == (8, 128, 128)
    with torch.device("meta"):
        ref = AutoencoderKLFlux2()
    theirs = {k: tuple(t.shape) for k, t in ref.state_dict().items()}
    abstract = nnx.eval_shape(lambda: Flux2VAE(cfg, rngs=nnx.Rngs(0)))
    table = weight_table(abstract)
    shapes = convert.param_shapes(nnx.state(abstract))
    ours = {r.key: r.transform.theirs_shape(shapes[r.path]) for r in table.rows}
    assert ours == {k: v for k, v in theirs.items() if k != "bn.num_batches_tracked"}
    assert Flux2VAEConfig.from_diffusers(dict(ref.config)) == cfg


@pytest.mark.parametrize("key,value,message", [
    ("decoder_block_out_channels", [12], r"decoder_block_out_channels=\[12\] has 1 levels"),
    ("batch_norm_eps", 0, r"batch_norm_eps=0 must be a positive number"),
    ("patch_size", [2], r"patch_size=\[2\] must be two positive ints"),
    ("norm_num_groups", 5, r"norm_num_groups=5 does not divide the widths \[8, 12, 16\]"),
    ("up_block_types", ["UpDecoderBlock2D", "AttnUpDecoderBlock2D"], "up_block_types="),
])
def test_bad_config_is_one_line(key, value, message):
    with pytest.raises(ConfigError, match=message) as e:
        Flux2VAEConfig.from_diffusers(dict(TINY, **{key: value}))
    assert "\n" not in str(e.value)


def test_bfloat16_load_and_bad_folders(pair, tmp_path):
    _, vae, folder = pair
    vae16 = load_flux2_vae(folder, dtype="bfloat16")
    leaves = jax.tree.leaves(nnx.state(vae16))
    assert len(leaves) == len(jax.tree.leaves(nnx.state(vae)))
    assert all(a.dtype == jnp.bfloat16 for a in leaves)     # parameters and bn statistics
    assert vae16.normalize_latents(jnp.zeros((1, 32, 1, 1), jnp.bfloat16)).dtype == jnp.bfloat16

    config = json.loads((folder / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(dict(config, latent_channels=0)))
    with pytest.raises(ConfigError, match="latent_channels=0 must be a positive int"):
        load_flux2_vae(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(dict(config, _class_name="AutoencoderKL")))
    with pytest.raises(WeightError, match="not an 'AutoencoderKLFlux2'"):
        load_flux2_vae(tmp_path)
