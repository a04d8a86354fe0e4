"""``ditax preprocess`` checks a Flux folder's sizes with the factor of that folder's VAE
(``vae/config.json``), not FLUX.1's default 8."""

from __future__ import annotations

import json

import pytest

from ditax.errors import RequestError
from ditax.train.preprocess import check_request


def test_flux_sizes_are_checked_with_the_folders_vae_factor(tmp_path):
    (tmp_path / "vae").mkdir()
    (tmp_path / "vae" / "config.json").write_text(json.dumps(
        {"_class_name": "AutoencoderKL", "block_out_channels": [8, 8, 8]}))     # factor 4
    kw = dict(frames=1, text_len=8, dtype="float32", batch=1, family="flux")
    check_request(height=24, width=40, model=tmp_path, **kw)       # multiples of 4 x 2
    with pytest.raises(RequestError, match="multiple of 8"):
        check_request(height=20, width=40, model=tmp_path, **kw)
    # a folder without a VAE config (a hub id): FLUX.1's factor 8, multiples of 16
    with pytest.raises(RequestError, match="multiple of 16"):
        check_request(height=24, width=40, model=tmp_path / "hub", **kw)
    check_request(height=32, width=48, model=None, **kw)


def test_wan_sizes_are_checked_with_the_folders_vae_factor(tmp_path):
    """A Wan 2.2 TI2V folder's VAE (2x2 patches, 16x spatial) refuses what 2.1's 8x takes:
    with the transformer's 2x2 patch, sides are multiples of 32 (issue 57: the VAE's factor
    times the patch, not the VAE's alone); a folder without a VAE config keeps the 2.1 rule,
    8 x 2 = 16."""
    from ditax.models.vae.wan.config import vae_preset

    cfg = vae_preset("wan2.2")
    (tmp_path / "vae").mkdir()
    (tmp_path / "vae" / "config.json").write_text(json.dumps(
        {"_class_name": "AutoencoderKLWan", "base_dim": cfg.base_dim,
         "decoder_base_dim": cfg.decoder_base_dim, "z_dim": cfg.z_dim, "is_residual": True,
         "patch_size": 2, "in_channels": 12, "out_channels": 12, "scale_factor_spatial": 16}))
    kw = dict(frames=5, text_len=8, dtype="float32", batch=1, family="wan")
    check_request(height=32, width=64, model=tmp_path, **kw)
    with pytest.raises(RequestError, match="width=48 must be a positive multiple of 32"):
        check_request(height=32, width=48, model=tmp_path, **kw)
    check_request(height=32, width=48, model=tmp_path / "hub", **kw)     # 2.1's 8x x 2
    with pytest.raises(RequestError, match="height=24 must be a positive multiple of 16"):
        check_request(height=24, width=48, model=tmp_path / "hub", **kw)
