"""``WanVAE.plan_decode``: whether the decode fits a device, from shapes alone (the full-size
Wan 2.1 and 2.2 VAEs as abstract modules: nothing runs). On a TPU v5e's budget the float32
Wan 2.1 decode at 720x1280 does not fit whole (the chip ran out of memory there) but does in
spatial tiles; in bfloat16 it fits whole; the tiled estimate holds the tiles the blend keeps."""

from __future__ import annotations

import jax.numpy as jnp
import pytest
from flax import nnx

from ditax.models.vae.wan import WanVAE
from ditax.models.vae.wan.chunks import MEMORY_FRACTION
from ditax.models.vae.wan.config import vae_preset
from ditax.models.vae.wan.fit import plan_decode
from ditax.pipelines.decode_fit import refusal_line, tiles_line

V5E = int(MEMORY_FRACTION * 15.75 * 2**30)   # 80% of a v5e's bytes_limit: 12.6 GiB


def _vae(name: str, dtype: str):
    return nnx.eval_shape(lambda: WanVAE(vae_preset(name), dtype=jnp.dtype(dtype),
                                         rngs=nnx.Rngs(0)))


@pytest.mark.parametrize("dtype, whole", [("float32", False), ("bfloat16", True)])
def test_720p_wan21_fits_whole_only_in_bfloat16_and_in_tiles_either_way(dtype, whole):
    fit = plan_decode(_vae("wan2.1", dtype), (1, 16, 21, 90, 160), path="plain", budget=V5E,
                      tiles=True)
    assert (fit.size, fit.dtype) == ("720x1280x81", dtype)
    assert fit.fits_whole == whole and fit.fits_tiled
    assert fit.tiled < fit.whole / 3 and fit.tile_frames is None   # plain: one frame a chunk
    if not whole:
        assert fit.whole > 15.75 * 2**30          # more than the whole chip
        assert fit.in_bfloat16(fit.whole) <= V5E
        line = tiles_line(fit)
        assert line.startswith("VAE decode: 720x1280x81 float32 needs ~")
        assert "over the 12.6 GiB budget of the device: decoding in spatial tiles" in line
        assert "sample.vae_tiling=true" in line and "bfloat16" in line
        assert len(line.splitlines()) == 1


def test_the_tiled_estimate_holds_every_tile_and_the_video():
    """The tiles of a 720p frame (4 x 7 of 256 px every 192 px): the blend holds all their
    frames and the video besides the parameters, so the tiled estimate is at least that."""
    vae = _vae("wan2.1", "float32")
    fit = plan_decode(vae, (1, 16, 21, 90, 160), path="plain", budget=V5E)
    tile = vae.video_bytes((1, 21, 32, 32, 16))
    assert tile == 81 * 256 * 256 * 3 * 4
    assert fit.tiled >= 4 * 7 * tile + vae.video_bytes((1, 21, 90, 160, 16))


def test_wan22_plans_with_its_patches():
    """The Wan 2.2 VAE (16x spatial, 2x2 pixel patches): its tiles are 16 latent pixels; the
    tiles are planned only where the whole decode does not fit."""
    vae = _vae("wan2.2", "float32")
    fit = plan_decode(vae, (1, 48, 21, 44, 80), path="plain", budget=V5E, tiles=True)
    assert fit.size == "704x1280x81" and fit.tiled is not None and fit.tiled < fit.whole
    assert plan_decode(vae, (1, 48, 21, 44, 80), path="plain", budget=fit.whole).tiled is None
    assert plan_decode(vae, (1, 48, 21, 44, 80), path="plain",
                       budget=fit.whole - 1).tiled == fit.tiled


def test_a_frame_within_one_tile_has_no_tiled_plan():
    fit = plan_decode(_vae("wan2.1", "float32"), (1, 16, 21, 30, 32), path="plain", budget=1)
    assert fit.tiled is None and not fit.fits_whole and not fit.fits_tiled
    line = refusal_line(fit)
    assert "one spatial tile covers the frame" in line and "lower --height" in line
    assert "model.vae_dtype=bfloat16" in line and "sample.vae_parallel=true" in line
