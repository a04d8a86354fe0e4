"""LTX-2 video VAE (diffusers AutoencoderKLLTX2Video): tiny random models with the LTX-2.0 and
LTX-2.3 switches (tests/refs/ltx2_vae_reference.py) saved with save_pretrained and loaded with
ditax — encode moments and decode (timestep-conditioned per sample for the 2.0 one) equal to
diffusers, the gradient of decode w.r.t. the latents equal to torch's, the pipeline's latent
normalisation and decode inputs, and one-line errors for bad shapes and configs. Tiled and
clip-by-clip runs: test_ltx2_video_vae_tiled.py."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

from flax import nnx  # noqa: E402

from ditax.errors import ConfigError, RequestError, WeightError  # noqa: E402
from ditax.io import convert  # noqa: E402
from ditax.models.vae.ltx2 import LTX2VideoVAEConfig, Tiles, load_ltx2_video_vae  # noqa: E402
from ditax.models.vae.ltx2.convert import weight_table  # noqa: E402
from ditax.parallel.platform import target_platform  # noqa: E402
from ltx2_vae_reference import CONFIGS, rel, saved_pair  # noqa: E402

TOL = 1e-5
_BUILT: dict = {}


def _build(name: str, tmp_path_factory):
    if name not in _BUILT:
        folder = tmp_path_factory.mktemp(f"ltx2_vae_{name}")
        _BUILT[name] = (name, *saved_pair(name, folder), folder)
    return _BUILT[name]


@pytest.fixture(scope="module", params=list(CONFIGS))
def pair(request, tmp_path_factory):
    return _build(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def ltx2(tmp_path_factory):
    """The LTX-2.0-like model (timestep-conditioned, reflect-padded decoder)."""
    return _build("ltx2", tmp_path_factory)


@pytest.fixture(scope="module")
def ltx23(tmp_path_factory):
    return _build("ltx23", tmp_path_factory)


def test_encode_and_decode_match_diffusers(pair, rng):
    name, ref, vae, _ = pair
    video = rng.uniform(-1, 1, (2, 3, 9, 16, 24)).astype(np.float32)   # latents 3 x 2 x 3
    z = rng.standard_normal((2, 8, 3, 2, 3)).astype(np.float32)
    t = np.array([0.05, 0.4], np.float32) if vae.timestep_conditioning else None
    with torch.no_grad():
        post = ref.encode(torch.from_numpy(video)).latent_dist
        dec = ref.decode(torch.from_numpy(z), None if t is None else torch.from_numpy(t)).sample
    mean, logvar = vae.encode_moments(video)
    assert mean.shape == logvar.shape == (2, 8, 3, 2, 3)
    assert rel(mean, post.mean.numpy()) < TOL and rel(logvar, post.logvar.numpy()) < TOL
    assert float(jnp.std(logvar[:, 0])) > 0.01            # the shared channel is not constant
    got = vae.decode(z, t)
    assert got.shape == (2, 3, 9, 16, 24)
    assert rel(got, dec.numpy()) < TOL
    if t is not None:   # the timestep reaches the output: swapping it per sample changes it
        assert rel(got[0], vae.decode(z, t[::-1])[0]) > 1e-3
    assert (vae.spatial_compression_ratio, vae.temporal_compression_ratio) == (8, 4)


def test_decode_gradient_matches_torch(ltx2, rng):
    """d/dz of sum(decode(z) * w), through the timestep-conditioned, reflect-padded decoder."""
    _, ref, vae, _ = ltx2
    z = rng.standard_normal((1, 8, 2, 2, 3)).astype(np.float32)
    w = rng.standard_normal((1, 3, 5, 16, 24)).astype(np.float32)
    t = np.array([0.2], np.float32)
    zt = torch.from_numpy(z).requires_grad_(True)
    loss = (ref.decode(zt, torch.from_numpy(t)).sample * torch.from_numpy(w)).sum()
    loss.backward()

    graphdef, state = nnx.split(vae)
    cl = lambda a: jnp.transpose(jnp.asarray(a), (0, 2, 3, 4, 1))  # noqa: E731

    @jax.jit
    def ours(zc):
        return jnp.sum(nnx.merge(graphdef, state).decode_latents(zc, jnp.asarray(t)) * cl(w))

    value, grad = jax.value_and_grad(ours)(cl(z))
    assert abs(float(value) - loss.item()) <= TOL * abs(loss.item())
    assert rel(grad, cl(zt.grad.numpy())) < TOL


def test_one_3d_convolution_off_cpu_gives_the_same(ltx2, rng):
    """Off CPU every convolution is one 3-D convolution (on CPU: per-frame 2-D ones, which the
    other tests run): lowered for CUDA here, encoder (zero padding) and decoder (reflect
    padding) still equal diffusers."""
    _, ref, vae, _ = ltx2
    video = rng.uniform(-1, 1, (1, 3, 5, 16, 16)).astype(np.float32)
    z = rng.standard_normal((1, 8, 2, 2, 2)).astype(np.float32)
    t = np.array([0.1], np.float32)
    with torch.no_grad():
        post = ref.encode(torch.from_numpy(video)).latent_dist
        dec = ref.decode(torch.from_numpy(z), torch.from_numpy(t)).sample.numpy()
    graphdef, state = nnx.split(vae)
    cl = lambda a: jnp.transpose(jnp.asarray(a), (0, 2, 3, 4, 1))  # noqa: E731

    def both(state, x, zc):
        m = nnx.merge(graphdef, state)
        return m.moments(x), m.decode_latents(zc, jnp.asarray(t))

    with target_platform("cuda", compute_capability=(9, 0)):
        h, out = jax.jit(both)(state, cl(video), cl(z))
    assert rel(h[..., :-1], cl(post.mean.numpy())) < TOL
    assert rel(out, cl(dec)) < TOL


def test_latent_normalisation_and_decode_inputs(pair, rng):
    """The LTX-2 pipeline's (z - mean) * scaling / std and inverse with the checkpoint's
    buffers, and its decode step: noise mixed in by decode_noise_scale (default: the decode
    timestep) before denormalising, for a conditioned decoder only."""
    name, ref, vae, _ = pair
    lat = rng.standard_normal((2, 8, 2, 2, 3)).astype(np.float32)
    noise = rng.standard_normal(lat.shape).astype(np.float32)
    mean = ref.latents_mean.numpy().reshape(1, -1, 1, 1, 1)
    std = ref.latents_std.numpy().reshape(1, -1, 1, 1, 1)
    sc = ref.config.scaling_factor
    np.testing.assert_allclose(vae.normalize_latents(lat), (lat - mean) * sc / std, rtol=1e-6)
    np.testing.assert_allclose(vae.denormalize_latents(lat), lat * std / sc + mean, rtol=1e-6)
    if not vae.timestep_conditioning:
        z, t = vae.decode_inputs(lat)
        assert t is None and rel(z, lat * std / sc + mean) < 1e-6
        with pytest.raises(RequestError, match="no timestep conditioning"):
            vae.decode_inputs(lat, decode_timestep=0.05)
        return
    z, t = vae.decode_inputs(lat, decode_timestep=[0.05, 0.1], noise=noise)
    s = np.array([0.05, 0.1], np.float32).reshape(2, 1, 1, 1, 1)
    np.testing.assert_allclose(t, [0.05, 0.1])
    assert rel(z, ((1 - s) * lat + s * noise) * std / sc + mean) < 1e-6
    z, t = vae.decode_inputs(lat, decode_timestep=0.05, decode_noise_scale=0.5, noise=noise)
    assert rel(z, (0.5 * lat + 0.5 * noise) * std / sc + mean) < 1e-6
    with pytest.raises(RequestError, match="exactly one of noise"):
        vae.decode_inputs(lat, decode_timestep=0.05)


def _one_line(excinfo, *parts):
    msg = str(excinfo.value)
    assert "\n" not in msg
    for p in parts:
        assert p in msg, msg


def test_bad_shapes_give_one_line_naming_value_and_fix(pair):
    name, _, vae, _ = pair
    ok = np.zeros((1, 3, 9, 16, 24), np.float32)
    for shape, parts in (((1, 3, 10, 16, 24), ("10", "4k+1", "use 9 or 13")),
                         ((1, 3, 9, 20, 24), ("20x24", "multiples of 8")),
                         ((1, 4, 9, 16, 24), ("3 channels", "(1, 4, 9, 16, 24)")),
                         ((3, 9, 16, 24), ("rank 4", "batch axis"))):
        with pytest.raises(RequestError) as e:
            vae.encode(np.zeros(shape, np.float32))
        _one_line(e, *parts)
    with pytest.raises(RequestError) as e:
        vae.decode(np.zeros((1, 7, 2, 2, 3), np.float32))
    _one_line(e, "[B, 8, F, Y, X]", "(1, 7, 2, 2, 3)")
    z = np.zeros((1, 8, 2, 2, 3), np.float32)
    with pytest.raises(RequestError) as e:
        vae.decode(z, None if vae.timestep_conditioning else 0.05)
    _one_line(e, "timestep")
    with pytest.raises(RequestError) as e:
        vae.encode(ok, tiled=True, tiles=Tiles(tile_sample_min_height=20))
    _one_line(e, "tile_sample_min_height=20", "multiple of 8")
    with pytest.raises(RequestError) as e:
        vae.decode(z, 0.1 if vae.timestep_conditioning else None, framewise=True,
                   tiles=Tiles(tile_sample_min_num_frames=8, tile_sample_stride_num_frames=12))
    _one_line(e, "tile_sample_stride_num_frames=12", "exceeds")


def test_config_rules():
    base = dict(CONFIGS["ltx23"])
    for change, err, part in (
            (dict(downsample_type=["spatial", "temporal", "conv"]), NotImplementedError, "'conv'"),
            (dict(decoder_inject_noise=True), NotImplementedError, "decoder_inject_noise"),
            (dict(timestep_conditioning=True), NotImplementedError, "timestep_conditioning"),
            (dict(spatial_compression_ratio=None), ConfigError,
             'set "spatial_compression_ratio": 8'),
            (dict(upsample_type=["spatiotemporal", "spatial", "spatial"]), ConfigError, "expands"),
            (dict(decoder_block_out_channels=[24, 16, 32]), ConfigError, "receives"),
            (dict(layers_per_block=[1, 1]), ConfigError, "layers_per_block has 2 entries")):
        with pytest.raises(err, match=None) as e:
            LTX2VideoVAEConfig.from_diffusers({**base, **change})
        assert part in str(e.value), (change, str(e.value))
    # the real checkpoints' configs (diffusers' convert_ltx2_to_diffusers.py) are accepted
    for real in (dict(decoder_causal=False, spatial_compression_ratio=32,
                      temporal_compression_ratio=8),
                 dict(block_out_channels=[256, 512, 1024, 1024],
                      decoder_block_out_channels=[256, 512, 512, 1024],
                      layers_per_block=[4, 6, 4, 2, 2], decoder_layers_per_block=[4, 6, 4, 2, 2],
                      decoder_spatio_temporal_scaling=[True] * 4, decoder_inject_noise=[False] * 5,
                      upsample_type=["spatiotemporal", "spatiotemporal", "temporal", "spatial"],
                      upsample_residual=[False] * 4, upsample_factor=[2, 2, 1, 2],
                      timestep_conditioning=True, decoder_causal=False,
                      decoder_spatial_padding_mode="zeros", spatial_compression_ratio=32,
                      temporal_compression_ratio=8)):
        cfg = LTX2VideoVAEConfig.from_diffusers(real)
        assert (cfg.spatial_factor, cfg.temporal_factor) == (32, 8)


def test_export_round_trip_and_loader_refuses_another_vae(ltx23, tmp_path):
    """The weight table read back (ditax → diffusers) is diffusers' state dict, buffers and
    all; a folder of another VAE class is refused by name."""
    _, ref, vae, folder = ltx23
    got = convert.export(weight_table(vae), vae)
    want = {k: v.numpy() for k, v in ref.state_dict().items()}
    assert set(got) == set(want) and "latents_std" in got and len(got) > 50
    for k, v in want.items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)
    cfg = json.loads((folder / "config.json").read_text())
    (tmp_path / "vae").mkdir()
    other = {**cfg, "_class_name": "AutoencoderKLWan"}
    (tmp_path / "vae" / "config.json").write_text(json.dumps(other))
    (tmp_path / "vae" / "diffusion_pytorch_model.safetensors").symlink_to(
        folder / "diffusion_pytorch_model.safetensors")
    with pytest.raises(WeightError, match="not an 'AutoencoderKLLTX2Video'"):
        load_ltx2_video_vae(tmp_path)
