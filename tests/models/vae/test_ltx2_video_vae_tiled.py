"""LTX-2 video VAE tiling: the tiny LTX-2.0-like diffusers AutoencoderKLLTX2Video (timestep-
conditioned, reflect-padded decoder; tests/refs/ltx2_vae_reference.py) with tiny tiles on inputs
larger / longer than one — ditax's tiled (``enable_tiling()``) and clip-by-clip
(``use_framewise_decoding``) decode and encode equal diffusers', each compiled program run on
one tile at a time. Tile heights and widths differ, so a swapped axis shows; the grids are
chosen so every tile is at least 2 latent pixels wide (torch cannot reflect-pad one)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

from ditax.models.vae.ltx2 import Tiles  # noqa: E402
from ditax.models.vae.ltx2 import model as vae_model  # noqa: E402
from ltx2_vae_reference import rel, saved_pair  # noqa: E402

TOL = 1e-5
# pixels / frames: tiles 24 x 32 px every 16 px (3 x 4 latent px every 2); clips of 8 frames
# (2 latent frames + 1) every 4 (1 latent frame)
TILES = Tiles(tile_sample_min_height=24, tile_sample_min_width=32, tile_sample_min_num_frames=8,
              tile_sample_stride_height=16, tile_sample_stride_width=16,
              tile_sample_stride_num_frames=4)


@pytest.fixture(scope="module")
def ltx2(tmp_path_factory):
    return saved_pair("ltx2", tmp_path_factory.mktemp("ltx2_vae_tiled"))


def _reference(ref, tiled: bool, framewise: bool):
    """diffusers' switches as its enable_tiling() / use_framewise_decoding set them."""
    ref.use_tiling, ref.use_framewise_decoding = False, framewise
    if tiled:
        t = TILES
        ref.enable_tiling(t.tile_sample_min_height, t.tile_sample_min_width,
                          t.tile_sample_min_num_frames, t.tile_sample_stride_height,
                          t.tile_sample_stride_width, t.tile_sample_stride_num_frames)
    else:
        ref.tile_sample_min_num_frames = TILES.tile_sample_min_num_frames
        ref.tile_sample_stride_num_frames = TILES.tile_sample_stride_num_frames


def _spy(monkeypatch, name: str) -> list:
    """Record the (frames, height, width) of every input the jitted program ``name`` runs on."""
    seen, program = [], getattr(vae_model, name)

    def spy(graphdef, state, x, *rest):
        seen.append(tuple(x.shape[1:4]))
        return program(graphdef, state, x, *rest)

    monkeypatch.setattr(vae_model, name, spy)
    return seen


def _decode(ref, z, t, tiled, framewise):
    _reference(ref, tiled, framewise)
    with torch.no_grad():
        return ref.decode(torch.from_numpy(z), torch.from_numpy(t)).sample.numpy()


def test_tiled_decode_matches_diffusers(ltx2, rng, monkeypatch):
    """A 2 x 3 grid of latent tiles (rows of 3, 2; columns of 4, 4, 2), both blends."""
    ref, vae = ltx2
    z = rng.standard_normal((1, 8, 3, 4, 6)).astype(np.float32)
    t = np.array([0.1], np.float32)
    plain, want = _decode(ref, z, t, False, False), _decode(ref, z, t, True, False)
    assert rel(plain, want) > 1e-3          # the blends are not the identity: tiling is seen
    seen = _spy(monkeypatch, "decode_program")
    got = vae.decode(z, t, tiled=True, tiles=TILES)
    assert got.shape == want.shape == (1, 3, 9, 32, 48)
    assert rel(got, want) < TOL
    assert seen == [(3, 3, 4), (3, 3, 4), (3, 3, 2), (3, 2, 4), (3, 2, 4), (3, 2, 2)]


def test_framewise_tiled_decode_matches_diffusers(ltx2, rng, monkeypatch):
    """Clips of 3 and 2 latent frames (the last, one frame, contributes nothing and is not
    run), each one row of tiles 4, 4, 2 wide: the temporal blend over the spatial one."""
    ref, vae = ltx2
    z = rng.standard_normal((1, 8, 3, 2, 6)).astype(np.float32)
    t = np.array([0.3], np.float32)
    tiled, want = _decode(ref, z, t, True, False), _decode(ref, z, t, True, True)
    assert rel(tiled, want) > 1e-3          # the clips' blend is seen
    seen = _spy(monkeypatch, "decode_program")
    got = vae.decode(z, t, tiled=True, framewise=True, tiles=TILES)
    assert got.shape == want.shape == (1, 3, 9, 16, 48)
    assert rel(got, want) < TOL
    assert seen == [(3, 2, 4)] * 2 + [(3, 2, 2)] + [(2, 2, 4)] * 2 + [(2, 2, 2)]


def test_tiled_and_framewise_encode_match_diffusers(ltx2, rng, monkeypatch):
    """Spatial tiles (rows of 24, 16 px; columns of 32, 32, 16 px) on 9 frames, then clips of 9,
    9 and 5 frames (the last, one frame, not run) of a small video."""
    ref, vae = ltx2
    big = rng.uniform(-1, 1, (1, 3, 9, 32, 48)).astype(np.float32)
    long = rng.uniform(-1, 1, (1, 3, 13, 16, 24)).astype(np.float32)
    with torch.no_grad():
        _reference(ref, True, False)
        want_big = ref.encode(torch.from_numpy(big)).latent_dist
        _reference(ref, False, True)
        want_long = ref.encode(torch.from_numpy(long)).latent_dist
        _reference(ref, False, False)
        plain_long = ref.encode(torch.from_numpy(long)).latent_dist.mean.numpy()
    assert rel(plain_long, want_long.mean.numpy()) > 1e-3

    seen = _spy(monkeypatch, "encode_program")
    mean, logvar = vae.encode_moments(big, tiled=True, tiles=TILES)
    assert mean.shape == want_big.mean.shape == (1, 8, 3, 4, 6)
    assert rel(mean, want_big.mean.numpy()) < TOL and rel(logvar, want_big.logvar.numpy()) < TOL
    assert seen == [(9, 24, 32)] * 2 + [(9, 24, 16)] + [(9, 16, 32)] * 2 + [(9, 16, 16)]

    seen.clear()
    mean, logvar = vae.encode_moments(long, framewise=True, tiles=TILES)
    assert mean.shape == want_long.mean.shape == (1, 8, 4, 2, 3)
    assert rel(mean, want_long.mean.numpy()) < TOL
    assert rel(logvar, want_long.logvar.numpy()) < TOL
    assert seen == [(9, 16, 24)] * 2 + [(5, 16, 24)]
