"""LTX-2 audio VAE (diffusers AutoencoderKLLTX2Audio): tiny random models saved with
save_pretrained and loaded with ditax — posterior moments and decoded mel equal to diffusers for
the public models' switches (pixel norm, causal in time) and the others (GroupNorm / not causal /
attention; causal along bins / mel_bins null), the public layout key for key, clear errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

from flax import nnx  # noqa: E402

from ditax.errors import ConfigError, RequestError, WeightError  # noqa: E402
from ditax.io import convert  # noqa: E402
from ditax.models.ltx2.audio.config import LTX2AudioVAEConfig  # noqa: E402
from ditax.models.ltx2.audio.convert import load_audio_vae, loaded_state, weight_table  # noqa: E402
from ditax.models.ltx2.audio.model import LTX2AudioVAE  # noqa: E402
from ltx2_audio_reference import AUDIO_VAE, make_audio_vae, rel_err  # noqa: E402

TOL = 1e-5
_BUILT: dict = {}


def _pair(name, tmp_path_factory):
    if name not in _BUILT:
        ref = make_audio_vae(name, seed=len(name))
        folder = tmp_path_factory.mktemp(f"ltx2_audio_vae_{name}")
        ref.save_pretrained(folder)
        _BUILT[name] = ref, load_audio_vae(folder), folder
    return _BUILT[name]


@pytest.fixture(scope="module", params=list(AUDIO_VAE))
def pair(request, tmp_path_factory):
    return _pair(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def public(tmp_path_factory):
    return _pair("public", tmp_path_factory)


def test_encode_decode_match_diffusers(pair, rng):
    ref, vae, _ = pair
    cfg = ref.config
    # 19 frames: odd, so the causal stride-2 levels round up; 13 bins: odd, they round down
    mel = rng.standard_normal((2, cfg.in_channels, 19, 13)).astype(np.float32)
    with torch.no_grad():
        post = ref.encode(torch.from_numpy(mel)).latent_dist
    mean, logvar = vae.encode_moments(mel)
    assert mean.shape == logvar.shape == tuple(post.mean.shape)
    assert rel_err(mean, post.mean.numpy()) < TOL
    assert rel_err(logvar, post.logvar.numpy()) < TOL
    np.testing.assert_array_equal(np.asarray(vae.encode(mel)), np.asarray(mean))
    key = jax.random.key(1)
    eps = jax.random.normal(key, mean.shape, jnp.float32)
    np.testing.assert_allclose(np.asarray(vae.sample(mel, key)),
                               np.asarray(mean + jnp.exp(0.5 * logvar) * eps), rtol=1e-6)

    z = rng.standard_normal((2, cfg.latent_channels, 5, 4)).astype(np.float32)
    with torch.no_grad():
        expect = ref.decode(torch.from_numpy(z)).sample.numpy()
    got = np.asarray(vae.decode(z))
    # 4F - 3 frames; mel_bins bins (the latents' 4 when the config has none)
    assert got.shape == expect.shape == (2, cfg.output_channels, 17, cfg.mel_bins or 4)
    assert rel_err(got, expect) < TOL


def test_public_layout_matches_diffusers():
    """LTX2AudioVAEConfig() is the LTX-2 / 2.3 / 2.5 audio VAE (diffusers' conversion script's
    config): the same keys and shapes as diffusers' model built on the meta device."""
    from diffusers import AutoencoderKLLTX2Audio

    raw = {"_class_name": "AutoencoderKLLTX2Audio", "base_channels": 128, "output_channels": 2,
           "ch_mult": [1, 2, 4], "num_res_blocks": 2, "attn_resolutions": None,
           "in_channels": 2, "resolution": 256, "latent_channels": 8, "norm_type": "pixel",
           "causality_axis": "height", "dropout": 0.0, "mid_block_add_attention": False,
           "sample_rate": 16000, "mel_hop_length": 160, "is_causal": True, "mel_bins": 64,
           "double_z": True}
    cfg = LTX2AudioVAEConfig.from_diffusers(raw)
    assert cfg == LTX2AudioVAEConfig()
    assert (cfg.latent_mel_bins, cfg.latents_per_second, cfg.downsample_factor) == (16, 25.0, 4)
    with torch.device("meta"):
        ref = AutoencoderKLLTX2Audio(**{k: v for k, v in raw.items() if not k.startswith("_")})
    theirs = {k: tuple(t.shape) for k, t in ref.state_dict().items()}
    abstract = nnx.eval_shape(lambda: LTX2AudioVAE(cfg, rngs=nnx.Rngs(0)))
    table = weight_table(abstract)
    shapes = convert.param_shapes(loaded_state(abstract))
    assert {r.key: r.transform.theirs_shape(shapes[r.path]) for r in table.rows} == theirs
    # buffers are loaded but are not trainable parameters
    assert "latents_mean" not in nnx.to_pure_dict(nnx.state(abstract, nnx.Param))


def test_bad_inputs_and_configs(public, tmp_path):
    ref, vae, folder = public
    bad = [(lambda: vae.encode(np.zeros((2, 19, 16), np.float32)), r"\[B, 2, T, M\]"),
           (lambda: vae.encode(np.zeros((1, 3, 19, 16), np.float32)), "got shape"),
           (lambda: vae.encode(np.zeros((1, 2, 19, 2), np.float32)), "too small"),
           (lambda: vae.decode(np.zeros((1, 5, 16), np.float32)), "unpack_audio_latents"),
           (lambda: vae.decode(np.zeros((1, 2, 0, 4), np.float32)), "no empty axis"),
           (lambda: vae.normalize_latents(np.zeros((1, 5, 4), np.float32)), "one value per")]
    for call, match in bad:
        with pytest.raises(RequestError, match=match):
            call()
    for kw, match in [(dict(norm_type="group", base_channels=32), "causal resnets"),
                      (dict(norm_type="group", causality_axis="none", base_channels=48),
                       "do not divide"),
                      (dict(causality_axis="time"), "causality_axis='time'"),
                      (dict(double_z=False), "double_z"), (dict(dropout=0.1), "dropout")]:
        with pytest.raises(ConfigError, match=match):
            LTX2AudioVAEConfig(**kw).validate()
    cfg = (folder / "config.json").read_text().replace("AutoencoderKLLTX2Audio", "AutoencoderKL")
    (tmp_path / "config.json").write_text(cfg)
    with pytest.raises(WeightError, match="not an 'AutoencoderKLLTX2Audio'"):
        load_audio_vae(tmp_path)
    # the pipeline folder's subfolder resolves
    (tmp_path / "pipe").mkdir()
    (tmp_path / "pipe" / "audio_vae").symlink_to(folder)
    assert load_audio_vae(tmp_path / "pipe").config == vae.config
