"""Wan VAE: parity with diffusers' AutoencoderKLWan (tiny, random, saved and reloaded), chunking
and causality of the feature cache, latent normalisation, and clear errors on bad input."""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

from compiles import compiles  # noqa: E402
from flax import nnx  # noqa: E402

from ditax.errors import WeightError  # noqa: E402
from ditax.models.vae.wan.chunks import decode_chunk, encode_chunk  # noqa: E402
from ditax.models.vae.wan.convert import load_vae  # noqa: E402

TOL = 1e-4

CONFIGS = {
    # 8x spatial / 4x temporal like Wan 2.1, tiny widths
    "small": dict(base_dim=8, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                  temperal_downsample=[False, True, True]),
    # z_dim 16, a different decoder width, uneven channel multipliers
    "wide": dict(base_dim=8, decoder_base_dim=12, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=1,
                 temperal_downsample=[False, True, True]),
}
SHAPES = {"small": (2, 16, 16), "wide": (1, 16, 24)}  # batch, height, width


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


def _build_reference(cfg: dict, seed: int):
    """A diffusers AutoencoderKLWan with every tensor random (gammas not ones, biases non-zero)."""
    from diffusers import AutoencoderKLWan

    torch.manual_seed(seed)
    z = cfg["z_dim"]
    model = AutoencoderKLWan(**cfg, latents_mean=list(np.linspace(-1, 1, z)),
                             latents_std=list(np.linspace(0.5, 3, z))).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("gamma"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p[0].numel() ** 0.5)
        # keep most decoded pixels inside [-1, 1] so the clip does not hide differences
        model.decoder.conv_out.weight.mul_(0.3)
    return model


_BUILT: dict = {}


def _pair(name: str, tmp_path_factory):
    """(name, diffusers model, our loaded WanVAE, saved folder), built once per session."""
    if name not in _BUILT:
        ref = _build_reference(CONFIGS[name], seed=len(name))
        folder = tmp_path_factory.mktemp(f"vae_{name}")
        ref.save_pretrained(folder)
        _BUILT[name] = (name, ref, load_vae(folder), folder)
    return _BUILT[name]


@pytest.fixture(scope="module", params=list(CONFIGS))
def pair(request, tmp_path_factory):
    return _pair(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """Checks that do not depend on the config run on the small one only."""
    return _pair("small", tmp_path_factory)


@pytest.mark.parametrize("frames", [1, 5, 9])
def test_encode_decode_match_diffusers(pair, frames, rng):
    name, ref, vae, _ = pair
    b, h, w = SHAPES[name]
    video = rng.uniform(-1, 1, (b, 3, frames, h, w)).astype(np.float32)
    with torch.no_grad():
        post = ref.encode(torch.from_numpy(video)).latent_dist
    mean, logvar = vae.encode_moments(video)
    f_lat = 1 + (frames - 1) // 4
    assert mean.shape == (b, vae.z_dim, f_lat, h // 8, w // 8)
    assert _rel(mean, post.mean.numpy()) < TOL
    assert _rel(logvar, post.logvar.numpy()) < TOL
    np.testing.assert_array_equal(np.asarray(vae.encode(video)), np.asarray(mean))

    z = rng.standard_normal(mean.shape).astype(np.float32)
    with torch.no_grad():
        expect = ref.decode(torch.from_numpy(z)).sample.numpy()
    got = np.asarray(vae.decode(z))
    assert got.shape == (b, 3, frames, h, w) == expect.shape
    assert np.mean(np.abs(expect) < 1) > 0.5, "test weights saturate the clip; rescale conv_out"
    assert _rel(got, expect) < TOL
    assert np.abs(got).max() <= 1.0


def test_chunking_and_causality(pair, rng):
    """The cache makes chunked processing exact: a prefix of the input gives a prefix of the
    output, and feeding several chunks in one step equals feeding them one by one."""
    name, _, vae, _ = pair
    b, h, w = SHAPES[name]
    video = jnp.asarray(rng.uniform(-1, 1, (b, 3, 9, h, w)), jnp.float32)
    full = vae.encode(video)
    np.testing.assert_allclose(vae.encode(video[:, :, :5]), full[:, :, :2], rtol=0, atol=1e-5)

    z = jnp.asarray(rng.standard_normal((b, vae.z_dim, 3, h // 8, w // 8)), jnp.float32)
    dec = vae.decode(z)
    np.testing.assert_allclose(vae.decode(z[:, :, :2]), dec[:, :, :5], rtol=0, atol=1e-5)
    np.testing.assert_allclose(vae.decode(z[:, :, :1]), dec[:, :, :1], rtol=0, atol=1e-5)

    if name != "small":
        return  # the multi-chunk step check below compiles extra shapes; once is enough
    # two chunks in one step == two steps (encoder: 8 frames vs 4 + 4; decoder: 2 latents vs 1 + 1)
    graphdef, state = nnx.split(vae)
    x = jnp.transpose(video, (0, 2, 3, 4, 1))
    copy = functools.partial(jax.tree.map, jnp.copy)  # the steps donate (consume) their cache
    _, cache = encode_chunk(graphdef, state, x[:, :1], None, first=True)
    one, _ = encode_chunk(graphdef, state, x[:, 1:9], copy(cache), first=False)
    a, c2 = encode_chunk(graphdef, state, x[:, 1:5], cache, first=False)
    b2, _ = encode_chunk(graphdef, state, x[:, 5:9], c2, first=False)
    np.testing.assert_allclose(one, jnp.concatenate([a, b2], axis=1), rtol=0, atol=1e-5)

    zl = jnp.transpose(z, (0, 2, 3, 4, 1))
    first, cache = decode_chunk(graphdef, state, zl[:, :1], None, first=True)
    both, _ = decode_chunk(graphdef, state, zl[:, 1:3], cache, first=False)
    got = jnp.clip(jnp.concatenate([first, both], axis=1), -1, 1)
    np.testing.assert_allclose(jnp.transpose(got, (0, 4, 1, 2, 3)), dec, rtol=0, atol=1e-5)


def test_chunk_step_compiles_once_per_kind(pair, rng):
    """Decoding more frames reuses the jitted first-frame and next-frame steps (no recompiles)."""
    name, _, vae, _ = pair
    b, h, w = SHAPES[name]
    z = jnp.asarray(rng.standard_normal((b, vae.z_dim, 4, h // 8, w // 8)), jnp.float32)
    vae.decode(z[:, :, :2])  # both steps compiled (possibly already by earlier tests)
    with compiles() as log:
        vae.decode(z)
        vae.decode(z[:, :, :3])
    assert log.count("decode_chunk") == 0, log.names


def test_sample_and_latent_normalisation(pair, rng):
    name, ref, vae, _ = pair
    b, h, w = SHAPES[name]
    video = rng.uniform(-1, 1, (b, 3, 5, h, w)).astype(np.float32)
    key = jax.random.key(3)
    mean, logvar = vae.encode_moments(video)
    s = vae.sample(video, key)
    noise = jax.random.normal(key, mean.shape)
    np.testing.assert_allclose(s, mean + jnp.exp(0.5 * logvar) * noise, rtol=1e-6, atol=1e-6)
    assert not np.allclose(s, mean)

    assert vae.latents_mean == ref.config.latents_mean and vae.latents_std == ref.config.latents_std
    assert (vae.scale_factor_temporal, vae.scale_factor_spatial) == (4, 8)
    z = jnp.asarray(rng.standard_normal(mean.shape), jnp.float32)
    m = np.asarray(ref.config.latents_mean, np.float32).reshape(1, -1, 1, 1, 1)
    inv_std = 1.0 / np.asarray(ref.config.latents_std, np.float32).reshape(1, -1, 1, 1, 1)
    np.testing.assert_allclose(vae.normalize_latents(z), (np.asarray(z) - m) * inv_std, rtol=1e-6, atol=1e-6)
    # pipeline_wan decodes with latents / (1 / std) + mean
    np.testing.assert_allclose(vae.denormalize_latents(z), np.asarray(z) / inv_std + m, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(vae.denormalize_latents(vae.normalize_latents(z)), z, rtol=1e-5, atol=1e-5)


def test_bad_inputs(small):
    name, _, vae, _ = small
    with pytest.raises(ValueError, match="rank 4"):
        vae.encode(np.zeros((3, 5, 16, 16), np.float32))
    with pytest.raises(ValueError, match=r"frame count 6 is not of the form 4k\+1; use 5 or 9"):
        vae.encode(np.zeros((1, 3, 6, 16, 16), np.float32))
    with pytest.raises(ValueError, match="12x16 must be positive multiples of 8"):
        vae.encode(np.zeros((1, 3, 5, 12, 16), np.float32))
    with pytest.raises(ValueError, match="expected 3 channels"):
        vae.encode(np.zeros((1, 4, 5, 16, 16), np.float32))
    with pytest.raises(ValueError, match=r"latents \[B, 4, F, Y, X\]"):
        vae.decode(np.zeros((1, 16, 2, 2, 2), np.float32))
    with pytest.raises(ValueError, match="latents"):
        vae.decode(np.zeros((4, 2, 2, 2), np.float32))


def test_load_errors(small, tmp_path):
    name, ref, _, folder = small
    from safetensors.numpy import load_file, save_file

    tensors = load_file(folder / "diffusion_pytorch_model.safetensors")
    config = (folder / "config.json").read_text()

    def write(d, cfg=config):
        (tmp_path / "vae").mkdir(exist_ok=True)
        save_file(d, tmp_path / "vae" / "diffusion_pytorch_model.safetensors")
        (tmp_path / "vae" / "config.json").write_text(cfg)

    key = "decoder.up_blocks.0.upsamplers.0.resample.1.weight"
    renamed = dict(tensors)
    renamed["decoder.up_blocks.0.upsamplers.0.resample.2.weight"] = renamed.pop(key)
    write(renamed)
    with pytest.raises(WeightError) as e:
        load_vae(tmp_path)  # pipeline folder with vae/
    assert key in str(e.value) and "resample.2.weight" in str(e.value)

    missing = dict(tensors)
    del missing["encoder.mid_block.attentions.0.norm.gamma"]
    write(missing)
    with pytest.raises(WeightError, match=r"missing 1 key\(s\): .*attentions\.0\.norm\.gamma"):
        load_vae(tmp_path / "vae")

    wrong = dict(tensors)
    wrong["decoder.conv_in.weight"] = np.zeros((1, 2, 3, 3, 3), np.float32)
    write(wrong)
    with pytest.raises(WeightError, match=r"decoder\.conv_in\.weight: shape \(1, 2, 3, 3, 3\)"):
        load_vae(tmp_path / "vae")

    cfg = json.loads(config)
    cfg["is_residual"] = True
    write(tensors, json.dumps(cfg))
    with pytest.raises(NotImplementedError, match="is_residual"):
        load_vae(tmp_path / "vae")
    with pytest.raises(FileNotFoundError, match="neither an existing folder nor a hub id"):
        load_vae(tmp_path / "nothing")


def test_bfloat16_load(small):
    """dtype="bfloat16" converts every parameter to bf16 (rounded float32 values)."""
    name, _, vae32, folder = small
    vae16 = load_vae(folder, dtype="bfloat16")
    p16 = jax.tree.leaves(nnx.state(vae16))
    p32 = jax.tree.leaves(nnx.state(vae32))
    assert len(p16) == len(p32) and all(a.dtype == jnp.bfloat16 for a in p16)
    # every float32 parameter rounded to bf16 in one program (not one eager convert per shape)
    want = jax.jit(lambda ps: [p.astype(jnp.bfloat16) for p in ps])(p32)
    for a, b in zip(p16, want):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_tiled_decode_matches_diffusers(small, rng):
    """Spatially tiled decode (overlapping tiles, linear blends) equals diffusers' tiled_decode.
    Tiles of 2x2 latents every latent pixel on a 3x3 latent: full, edge and corner tiles. One
    latent frame keeps the compile count down; per-tile decoding is the ordinary chunked decode."""
    name, ref, vae, _ = small
    b = SHAPES[name][0]
    z = rng.standard_normal((b, vae.z_dim, 1, 3, 3)).astype(np.float32)
    ref.enable_tiling(tile_sample_min_height=16, tile_sample_min_width=16,
                      tile_sample_stride_height=8, tile_sample_stride_width=8)
    try:
        with torch.no_grad():
            expect = ref.decode(torch.from_numpy(z)).sample.numpy()
    finally:
        ref.disable_tiling()
    with torch.no_grad():  # the blends must matter here, or the test would not test tiling
        assert _rel(ref.decode(torch.from_numpy(z)).sample.numpy(), expect) > 1e-3
    got = np.asarray(vae.decode(z, tiled=True, tile_sample_min=(16, 16), tile_sample_stride=(8, 8)))
    assert got.shape == expect.shape == (b, 3, 1, 24, 24)
    assert _rel(got, expect) < TOL
    with pytest.raises(ValueError, match="must not exceed"):
        vae.decode(z, tiled=True, tile_sample_min=(16, 16), tile_sample_stride=(24, 8))
