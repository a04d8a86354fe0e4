"""Flux VAE (diffusers AutoencoderKL): tiny random models saved with save_pretrained and loaded
with ditax — encode moments and decode equal to diffusers (FLUX-like: no quant convs; SD-like:
quant convs), bfloat16 parameters, the FLUX.1 layout at full size, clear errors. Tiling:
test_kl_vae_tiled.py; gradients: test_kl_vae_grad.py (each file a few compiles)."""

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
from ditax.models.vae.kl import FluxVAE, FluxVAEConfig, load_vae  # noqa: E402
from ditax.models.vae.kl.convert import weight_table  # noqa: E402
from flux_vae_reference import CONFIGS, rel as _rel, saved_pair  # noqa: E402

TOL = 1e-5
_BUILT: dict = {}


def _pair(name: str, tmp_path_factory):
    if name not in _BUILT:
        folder = tmp_path_factory.mktemp(f"flux_vae_{name}")
        _BUILT[name] = (*saved_pair(name, folder), folder)
    return _BUILT[name]


@pytest.fixture(scope="module", params=list(CONFIGS))
def pair(request, tmp_path_factory):
    return _pair(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def flux(tmp_path_factory):
    return _pair("flux", tmp_path_factory)


def test_encode_decode_match_diffusers(pair, rng):
    ref, vae, _ = pair
    images = rng.uniform(-1, 1, (2, 3, 24, 40)).astype(np.float32)
    with torch.no_grad():
        post = ref.encode(torch.from_numpy(images)).latent_dist
    mean, logvar = vae.encode_moments(images)
    c = ref.config.latent_channels
    assert mean.shape == logvar.shape == (2, c, 12, 20)
    assert _rel(mean, post.mean.numpy()) < TOL
    assert _rel(logvar, post.logvar.numpy()) < TOL
    np.testing.assert_array_equal(np.asarray(vae.encode(images)), np.asarray(mean))

    key = jax.random.key(3)
    eps = jax.random.normal(key, mean.shape, jnp.float32)
    np.testing.assert_allclose(np.asarray(vae.sample(images, key)),
                               np.asarray(mean + jnp.exp(0.5 * logvar) * eps), rtol=1e-6)

    z = rng.standard_normal((2, c, 12, 20)).astype(np.float32)
    with torch.no_grad():
        expect = ref.decode(torch.from_numpy(z)).sample.numpy()
    got = np.asarray(vae.decode(z))
    assert got.shape == expect.shape == (2, 3, 24, 40)
    assert _rel(got, expect) < TOL


def test_normalisation_and_bfloat16(flux, rng):
    ref, vae, folder = flux
    z = rng.standard_normal((1, 16, 4, 6)).astype(np.float32)
    cfg = ref.config
    # the Flux pipeline: latents / scaling_factor + shift_factor before decoding
    np.testing.assert_allclose(np.asarray(vae.denormalize_latents(z)),
                               z / cfg.scaling_factor + cfg.shift_factor, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(vae.normalize_latents(vae.denormalize_latents(z))), z,
                               rtol=1e-5, atol=1e-6)

    vae16 = load_vae(folder, dtype="bfloat16")
    leaves = jax.tree.leaves(nnx.state(vae16, nnx.Param))
    assert leaves and all(a.dtype == jnp.bfloat16 for a in leaves)
    got = vae16.decode(z)
    assert got.dtype == jnp.bfloat16
    assert _rel(got.astype(jnp.float32), vae.decode(z)) < 3e-2


def test_flux1_layout_matches_diffusers():
    """FluxVAEConfig() is the FLUX.1 VAE: the same keys and shapes as diffusers' model of the
    FLUX.1 config (built on the meta device, no weights)."""
    from diffusers import AutoencoderKL

    cfg = FluxVAEConfig()
    raw = {"_class_name": "AutoencoderKL", "act_fn": "silu", "block_out_channels": [128, 256, 512, 512],
           "down_block_types": ["DownEncoderBlock2D"] * 4, "force_upcast": True, "in_channels": 3,
           "latent_channels": 16, "latents_mean": None, "latents_std": None, "layers_per_block": 2,
           "mid_block_add_attention": True, "norm_num_groups": 32, "out_channels": 3,
           "sample_size": 1024, "scaling_factor": 0.3611, "shift_factor": 0.1159,
           "up_block_types": ["UpDecoderBlock2D"] * 4, "use_post_quant_conv": False,
           "use_quant_conv": False}
    assert FluxVAEConfig.from_diffusers(raw) == cfg
    assert (cfg.spatial_factor, cfg.tile_latent_min_size) == (8, 128)
    with torch.device("meta"):
        ref = AutoencoderKL(**{k: v for k, v in raw.items() if not k.startswith("_")})
    theirs = {k: tuple(t.shape) for k, t in ref.state_dict().items()}
    abstract = nnx.eval_shape(lambda: FluxVAE(cfg, rngs=nnx.Rngs(0)))
    table = weight_table(abstract)
    shapes = convert.param_shapes(nnx.state(abstract, nnx.Param))
    ours = {r.key: r.transform.theirs_shape(shapes[r.path]) for r in table.rows}
    assert ours == theirs


def test_bad_inputs(flux):
    _, vae, _ = flux
    cases = [(np.zeros((3, 16, 16), np.float32), "encode", "rank 3"),
             (np.zeros((1, 4, 16, 16), np.float32), "encode", "expected 3 channels"),
             (np.zeros((1, 3, 13, 16), np.float32), "encode", "13x16 must be positive multiples of 2"),
             (np.zeros((1, 4, 2, 2), np.float32), "decode", r"latents \[B, 16, Y, X\]"),
             (np.zeros((1, 4, 64), np.float32), "decode", "unpack Flux's packed tokens"),
             (np.zeros((0, 16, 2, 2), np.float32), "decode", "no empty axis")]
    for x, method, message in cases:
        with pytest.raises(RequestError, match=message) as e:
            getattr(vae, method)(x)
        assert "\n" not in str(e.value)


def test_load_errors_and_deprecated_names(flux, tmp_path, rng):
    ref, vae, folder = flux
    from safetensors.numpy import load_file, save_file

    tensors = load_file(folder / "diffusion_pytorch_model.safetensors")
    config = json.loads((folder / "config.json").read_text())

    def write(d, cfg=config):
        (tmp_path / "vae").mkdir(exist_ok=True)
        save_file(d, tmp_path / "vae" / "diffusion_pytorch_model.safetensors")
        (tmp_path / "vae" / "config.json").write_text(json.dumps(cfg))

    # diffusers' deprecated attention names (query / key / value / proj_attn) load the same model
    old = {k.replace(".to_q.", ".query.").replace(".to_k.", ".key.").replace(".to_v.", ".value.")
            .replace(".to_out.0.", ".proj_attn."): t for k, t in tensors.items()}
    assert any(".proj_attn." in k for k in old)
    write(old)
    z = rng.standard_normal((2, 16, 12, 20)).astype(np.float32)   # the parity test's shape
    np.testing.assert_array_equal(np.asarray(load_vae(tmp_path).decode(z)), np.asarray(vae.decode(z)))

    missing = dict(tensors)
    del missing["decoder.mid_block.attentions.0.to_k.bias"]
    write(missing)
    with pytest.raises(WeightError, match=r"missing 1 key\(s\): decoder\.mid_block\.attentions\.0\.to_k\.bias"):
        load_vae(tmp_path / "vae")

    write(tensors, dict(config, use_quant_conv=True))
    with pytest.raises(WeightError, match=r"missing 2 key\(s\): quant_conv"):
        load_vae(tmp_path)

    wrong = dict(tensors)
    wrong["decoder.conv_in.weight"] = np.zeros((16, 8, 3, 3), np.float32)
    write(wrong)
    with pytest.raises(WeightError, match=r"decoder\.conv_in\.weight: shape \(16, 8, 3, 3\)"):
        load_vae(tmp_path)

    write(tensors, dict(config, _class_name="AutoencoderKLWan"))
    with pytest.raises(WeightError, match="'AutoencoderKLWan', not an 'AutoencoderKL'"):
        load_vae(tmp_path)
    for bad, message in ((dict(down_block_types=["AttnDownEncoderBlock2D"] * 2), "down_block_types"),
                         (dict(norm_num_groups=3), "norm_num_groups=3 does not divide"),
                         (dict(act_fn="gelu"), "act_fn='gelu'"),
                         (dict(sample_size=[16, 32]), "sample_size=\\[16, 32\\]")):
        write(tensors, dict(config, **bad))
        with pytest.raises(ConfigError, match=message):
            load_vae(tmp_path)
