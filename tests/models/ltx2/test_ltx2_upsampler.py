"""LTX-2's latent upsampler: a diffusers ``LTX2LatentUpsamplerModel`` folder read by
:func:`ditax.models.ltx2.upsampler.convert.load_latent_upsampler` gives diffusers' output on
random latents, for every upsampler kind diffusers builds; bad configs and folders are one
line."""

import json

import numpy as np
import pytest

from ditax.errors import ConfigError, WeightError
from ditax.models.ltx2.upsampler.config import LatentUpsamplerConfig
from ditax.models.ltx2.upsampler.convert import load_latent_upsampler
from ltx2_upsampler_reference import VARIANTS, run_upsampler, write_upsampler
from wan_reference import rel_err


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_upsampler_equals_diffusers(name, tmp_path):
    """Each kind (2x rational with its blur skipped, 1.5x with its blur strided 2, the 2-D
    shuffle, 2x in time and space, in time only) on 3 latent frames of 3x5 (odd sides: the
    strided blur rounds up): the shape and the values within 1e-5 (measured <= 9e-7)."""
    config = VARIANTS[name]
    ref = write_upsampler(tmp_path / name, config, seed=1)
    ours = load_latent_upsampler(tmp_path / name)
    x = np.random.default_rng(0).standard_normal((1, 8, 3, 3, 5)).astype(np.float32)
    want = run_upsampler(ref, x)
    got = np.asarray(ours(x))
    assert got.shape == want.shape == (1, 8) + ours.config.out_grid(3, 3, 5), got.shape
    assert rel_err(got, want) <= 1e-5, rel_err(got, want)


def test_original_key_names_are_read():
    """The original release's ``rational_resampler`` / ``spatial_scale`` name diffusers'
    ``use_rational_resampler`` / ``rational_spatial_scale``."""
    cfg = LatentUpsamplerConfig.from_diffusers(
        {"_class_name": "LTX2LatentUpsampler", "rational_resampler": False, "spatial_scale": 1.5})
    assert not cfg.use_rational_resampler and cfg.rational_spatial_scale == 1.5
    assert cfg.factors == (1, 2, 1)


def test_bad_configs_and_folders_are_one_line(tmp_path):
    for raw, words in (({"mid_channels": 48}, "mid_channels=48 is no multiple of 32"),
                       ({"rational_spatial_scale": 3.0}, "rational_spatial_scale=3.0"),
                       ({"spatial_upsample": False}, "are both false"),
                       ({"dims": 2, "temporal_upsample": True}, "temporal_upsample needs dims=3")):
        with pytest.raises(ConfigError) as e:
            LatentUpsamplerConfig.from_diffusers(raw)
        assert words in str(e.value) and "\n" not in str(e.value), e.value
    folder = tmp_path / "vae"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"_class_name": "AutoencoderKLLTX2Video"}))
    with pytest.raises(WeightError, match="not an 'LTX2LatentUpsamplerModel'"):
        load_latent_upsampler(folder)
