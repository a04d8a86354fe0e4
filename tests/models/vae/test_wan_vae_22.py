"""Wan 2.2 VAE (``AutoencoderKLWan(is_residual=True, patch_size=2)``, the TI2V-5B VAE): parity with
diffusers (tiny, random, saved and reloaded) for encode moments and decode, plain and tiled; the
parameter-free rearrangements against diffusers' own; export → reload round trip; config rules."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

from diffusers.models.autoencoders import autoencoder_kl_wan as ref_mod  # noqa: E402
from flax import nnx  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402

from ditax.errors import ConfigError  # noqa: E402
from ditax.io import convert  # noqa: E402
from ditax.models.vae.wan import WanVAE, WanVAEConfig  # noqa: E402
from ditax.models.vae.wan.shuffle import avg_down, dup_up, patchify, unpatchify  # noqa: E402
from ditax.models.vae.wan.convert import load_vae, weight_table  # noqa: E402

TOL = 1e-5
Z = 48
# the TI2V-5B layout (48 latent channels, 2x2 patches of 3 colours, 16x spatial, 4x temporal) with
# tiny widths; a decoder width different from the encoder's, as the 5B has (160 vs 256)
CONFIG = dict(base_dim=8, decoder_base_dim=12, z_dim=Z, dim_mult=[1, 2, 4, 4], num_res_blocks=1,
              temperal_downsample=[False, True, True], is_residual=True, patch_size=2,
              in_channels=12, out_channels=12, scale_factor_spatial=16, scale_factor_temporal=4)
B, H, W = 2, 32, 48  # latents 2 x 3: height and width differ, so a swap shows


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


def _t(x):
    """channels-last [B, F, Y, X, C] (ours) → torch [B, C, F, Y, X]."""
    return torch.from_numpy(np.ascontiguousarray(np.transpose(np.asarray(x), (0, 4, 1, 2, 3))))


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(diffusers model with every tensor random, our WanVAE loaded from its save_pretrained)."""
    torch.manual_seed(22)
    ref = ref_mod.AutoencoderKLWan(**CONFIG, latents_mean=list(np.linspace(-1, 1, Z)),
                                   latents_std=list(np.linspace(0.5, 3, Z))).eval()
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if name.endswith("gamma"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p[0].numel() ** 0.5)
        ref.decoder.conv_out.weight.mul_(0.3)  # keep most pixels inside the [-1, 1] clip
    folder = tmp_path_factory.mktemp("vae22")
    ref.save_pretrained(folder)
    return ref, load_vae(folder), folder


@pytest.mark.parametrize("frames", [9, 5, 1])  # 3 (odd), 2 and 1 latent frames
def test_encode_decode_match_diffusers(pair, frames, rng):
    ref, vae, _ = pair
    video = rng.uniform(-1, 1, (B, 3, frames, H, W)).astype(np.float32)
    with torch.no_grad():
        post = ref.encode(torch.from_numpy(video)).latent_dist
    mean, logvar = vae.encode_moments(video)
    f_lat = 1 + (frames - 1) // 4
    assert mean.shape == (B, Z, f_lat, H // 16, W // 16) == tuple(post.mean.shape)
    assert _rel(mean, post.mean.numpy()) < TOL
    assert _rel(logvar, post.logvar.numpy()) < TOL
    np.testing.assert_array_equal(np.asarray(vae.encode(video)), np.asarray(mean))
    key = jax.random.key(frames)
    noise = jax.random.normal(key, mean.shape)
    np.testing.assert_allclose(vae.sample(video, key), mean + jnp.exp(0.5 * logvar) * noise,
                               rtol=1e-6, atol=1e-6)

    z = rng.standard_normal(mean.shape).astype(np.float32)
    with torch.no_grad():
        expect = ref.decode(torch.from_numpy(z)).sample.numpy()
    got = np.asarray(vae.decode(z))
    assert got.shape == expect.shape == (B, 3, frames, H, W)
    assert np.mean(np.abs(expect) < 1) > 0.5, "test weights saturate the clip; rescale conv_out"
    assert _rel(got, expect) < TOL


def test_chunked_cache_is_causal(pair, rng):
    """A prefix of the video / latents gives a prefix of the latents / video (the cache carries
    exactly the context of the earlier chunks, and the first chunk is handled on its own)."""
    _, vae, _ = pair
    video = jnp.asarray(rng.uniform(-1, 1, (B, 3, 9, H, W)), jnp.float32)
    np.testing.assert_allclose(vae.encode(video[:, :, :5]), vae.encode(video)[:, :, :2], rtol=0, atol=1e-5)
    z = jnp.asarray(rng.standard_normal((B, Z, 3, H // 16, W // 16)), jnp.float32)
    np.testing.assert_allclose(vae.decode(z[:, :, :2]), vae.decode(z)[:, :, :5], rtol=0, atol=1e-5)


def test_tiled_decode_matches_diffusers(pair, rng):
    """Tiles are blended on the decoder's output before unpatchify (half the pixels), as in
    diffusers: tiles of 2x2 latents every latent pixel on a 3x3 latent."""
    ref, vae, _ = pair
    z = rng.standard_normal((1, Z, 1, 3, 3)).astype(np.float32)
    ref.enable_tiling(tile_sample_min_height=32, tile_sample_min_width=32,
                      tile_sample_stride_height=16, tile_sample_stride_width=16)
    try:
        with torch.no_grad():
            expect = ref.decode(torch.from_numpy(z)).sample.numpy()
    finally:
        ref.disable_tiling()
    with torch.no_grad():  # the blends must matter here, or the test would not test tiling
        assert _rel(ref.decode(torch.from_numpy(z)).sample.numpy(), expect) > 1e-3
    got = np.asarray(vae.decode(z, tiled=True, tile_sample_min=(32, 32), tile_sample_stride=(16, 16)))
    assert got.shape == expect.shape == (1, 3, 1, 48, 48)
    assert _rel(got, expect) < TOL
    with pytest.raises(ValueError, match="multiples of 16"):
        vae.decode(z, tiled=True, tile_sample_min=(24, 24), tile_sample_stride=(16, 16))


def test_rearrangements_match_diffusers(rng):
    """patchify / unpatchify and the shortcuts (AvgDown3D, DupUp3D) equal diffusers' exactly,
    on first chunks (1 frame: padded / trimmed) and later ones."""
    x = rng.standard_normal((2, 3, 6, 8, 3)).astype(np.float32)  # [B, F, H, W, C]
    np.testing.assert_array_equal(_t(patchify(x, 2)).numpy(), ref_mod.patchify(_t(x), 2).numpy())
    np.testing.assert_array_equal(unpatchify(patchify(x, 2), 2), x)
    np.testing.assert_array_equal(_t(unpatchify(patchify(x, 2), 2)).numpy(),
                                  ref_mod.unpatchify(ref_mod.patchify(_t(x), 2), 2).numpy())
    for frames in (1, 4):
        x = rng.standard_normal((2, frames, 4, 6, 8)).astype(np.float32)
        for cout, ft, fs in ((16, 2, 2), (8, 1, 2), (8, 1, 1)):
            want = ref_mod.AvgDown3D(8, cout, ft, fs)(_t(x)).numpy()
            np.testing.assert_allclose(_t(avg_down(x, cout, ft, fs)).numpy(), want, rtol=1e-6, atol=1e-6)
        for cout, ft in ((8, 2), (4, 2), (16, 1)):
            for first in (True, False):
                want = ref_mod.DupUp3D(8, cout, ft, 2)(_t(x), first_chunk=first).numpy()
                np.testing.assert_array_equal(_t(dup_up(x, cout, ft, 2, first)).numpy(), want)


def test_export_reload_round_trip(pair, tmp_path):
    """ours → export (diffusers keys and layouts) equals diffusers' state dict bit for bit;
    saved and reloaded it gives back every parameter exactly."""
    ref, vae, folder = pair
    table = weight_table(vae)
    exported = convert.export(table, vae)
    theirs = {k: v.numpy() for k, v in ref.state_dict().items()}
    assert sorted(exported) == sorted(theirs)
    # the 2.2 paths: one (not a list of) resampler per level; the shortcuts hold no tensor
    assert any(".up_blocks.0.upsampler.time_conv." in k for k in exported)
    assert any(".down_blocks.1.downsampler.resample.1." in k for k in exported)
    for k, v in exported.items():
        np.testing.assert_array_equal(v, theirs[k], err_msg=k)
    out = tmp_path / "vae"
    out.mkdir()
    save_file({k: np.ascontiguousarray(v) for k, v in exported.items()},
              out / "diffusion_pytorch_model.safetensors")
    (out / "config.json").write_text((folder / "config.json").read_text())
    back = load_vae(out)
    for (path, a), (_, b) in zip(nnx.to_flat_state(nnx.state(vae, nnx.Param)),
                                 nnx.to_flat_state(nnx.state(back, nnx.Param))):
        np.testing.assert_array_equal(np.asarray(b.get_value()), np.asarray(a.get_value()), err_msg=str(path))


def test_config_and_inputs(pair):
    _, vae, folder = pair
    assert (vae.scale_factor_temporal, vae.scale_factor_spatial, vae.z_dim) == (4, 16, Z)
    assert vae.config.video_channels == 3 and vae.config.latent_grid(9, H, W) == (3, 2, 3)
    with pytest.raises(ValueError, match="expected 3 channels"):
        vae.encode(np.zeros((1, 12, 5, 32, 32), np.float32))
    with pytest.raises(ValueError, match="40x32 must be positive multiples of 16"):
        vae.encode(np.zeros((1, 3, 5, 40, 32), np.float32))

    cfg = json.loads((folder / "config.json").read_text())
    with pytest.raises(NotImplementedError, match="is_residual=True, patch_size=None"):
        WanVAEConfig.from_diffusers({**cfg, "patch_size": None})
    with pytest.raises(NotImplementedError, match="is_residual=False, patch_size=2"):
        WanVAEConfig.from_diffusers({**cfg, "is_residual": False})
    with pytest.raises(ConfigError, match="in_channels=3 must be a multiple of patch_size"):
        WanVAEConfig.from_diffusers({**cfg, "in_channels": 3})
    with pytest.raises(ConfigError, match="encoder level 3 pools 32 channels x 1 positions into 64"):
        WanVAEConfig.from_diffusers({**cfg, "dim_mult": [1, 2, 4, 8]})
    with pytest.raises(ConfigError, match=r"decoder level 2 spreads 96 channels over 12 x 4 positions"):
        WanVAEConfig.from_diffusers({**cfg, "dim_mult": [1, 1, 8, 8]})


def test_ti2v_5b_layout_matches_diffusers():
    """At full size (the TI2V-5B config, no weights: torch meta device, abstract NNX module)
    our table names every diffusers tensor with its shape, and nothing else."""
    cfg = dict(CONFIG, base_dim=160, decoder_base_dim=256, num_res_blocks=2,
               latents_mean=[0.0] * Z, latents_std=[1.0] * Z)
    with torch.device("meta"):
        ref = ref_mod.AutoencoderKLWan(**cfg)
    theirs = {k: tuple(v.shape) for k, v in ref.state_dict().items()}
    abstract = nnx.eval_shape(lambda: WanVAE(WanVAEConfig.from_diffusers(cfg), rngs=nnx.Rngs(0)))
    shapes = convert.param_shapes(nnx.state(abstract, nnx.Param))
    ours = {r.key: r.transform.theirs_shape(shapes[r.path]) for r in weight_table(abstract).rows}
    assert ours == theirs
