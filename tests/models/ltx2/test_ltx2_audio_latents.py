"""The LTX-2 pipeline's audio-latent arithmetic against diffusers' LTX2Pipeline itself (built
around a tiny random audio VAE, the other components None): latent frames of a video, the
noise shape and packing of prepare_audio_latents, normalisation with the VAE's statistics,
denormalise + unpack + decode as the pipeline ends; clear errors."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

from ditax.errors import RequestError  # noqa: E402
from ditax.models.ltx2.audio.convert import load_audio_vae  # noqa: E402
from ditax.models.ltx2.audio.latents import (audio_latent_frames, audio_latent_shape,  # noqa: E402
                                             denormalize_audio_latents, latent_mel_bins,
                                             pack_audio_latents, unpack_audio_latents)
from ltx2_audio_reference import make_audio_vae, rel_err  # noqa: E402


@pytest.fixture(scope="module")
def pipe_and_vae(tmp_path_factory):
    from diffusers import LTX2Pipeline

    ref = make_audio_vae("public", seed=3)
    folder = tmp_path_factory.mktemp("ltx2_audio_latents_vae")
    ref.save_pretrained(folder)
    pipe = LTX2Pipeline(scheduler=None, vae=None, audio_vae=ref, text_encoder=None,
                        tokenizer=None, connectors=None, transformer=None, vocoder=None)
    return pipe, load_audio_vae(folder)


def test_latent_frames_match_the_pipeline(pipe_and_vae):
    pipe, vae = pipe_and_vae
    per_second = (pipe.audio_sampling_rate / pipe.audio_hop_length
                  / float(pipe.audio_vae_temporal_compression_ratio))   # LTX2Pipeline.__call__
    assert per_second == vae.config.latents_per_second == 25.0
    for num_frames in (1, 2, 9, 17, 49, 97, 121, 161, 257):
        for fps in (8, 12.5, 23.976, 24, 25, 30, 50, 60):
            want = round(num_frames / fps * per_second)
            if want:
                assert audio_latent_frames(num_frames, fps, vae.sample_rate,
                                           vae.hop_length) == want, (num_frames, fps)
    assert audio_latent_frames(121, 24) == 126
    assert audio_latent_frames(np.int64(121), np.float32(24.0)) == 126
    assert audio_latent_frames(25, 8, 24000, 240) == 78     # another VAE's rates


def test_prepare_normalise_denormalise_unpack_decode(pipe_and_vae, rng):
    pipe, vae = pipe_and_vae
    cfg = vae.config
    m = latent_mel_bins(cfg.mel_bins)
    assert m == pipe.audio_vae.config.mel_bins // pipe.audio_vae_mel_compression_ratio == 4
    # noise: prepare_audio_latents draws [B, C, A, M'] and packs it
    shape = audio_latent_shape(2, cfg.latent_channels, 5, cfg.mel_bins)
    g = torch.Generator().manual_seed(0)
    packed = pipe.prepare_audio_latents(2, cfg.latent_channels, 5, cfg.mel_bins, generator=g,
                                        dtype=torch.float32).numpy()
    noise = torch.randn(shape, generator=torch.Generator().manual_seed(0)).numpy()
    np.testing.assert_array_equal(np.asarray(pack_audio_latents(noise)), packed)
    # given latents [B, C, A, M']: packed, then normalised with the VAE's statistics
    z = rng.standard_normal(shape).astype(np.float32)
    want = pipe.prepare_audio_latents(latents=torch.from_numpy(z), noise_scale=0.0,
                                      dtype=torch.float32).numpy()
    assert rel_err(vae.normalize_latents(pack_audio_latents(z)), want) < 1e-6
    # the pipeline's end: denormalise the tokens, unpack, decode
    tokens = rng.standard_normal(packed.shape).astype(np.float32)
    t = torch.from_numpy(tokens)
    mean, std = pipe.audio_vae.latents_mean, pipe.audio_vae.latents_std
    with torch.no_grad():
        latents = pipe._unpack_audio_latents(pipe._denormalize_audio_latents(t, mean, std), 5,
                                             num_mel_bins=m)
        mel = pipe.audio_vae.decode(latents, return_dict=False)[0].numpy()
    ours = unpack_audio_latents(vae.denormalize_latents(tokens), m, latent_length=5)
    assert rel_err(ours, latents.numpy()) < 1e-6
    assert rel_err(denormalize_audio_latents(tokens, mean.numpy(), std.numpy()),
                   pipe._denormalize_audio_latents(t, mean, std).numpy()) < 1e-6
    assert rel_err(vae.decode(ours), mel) < 1e-5


def test_bad_inputs():
    z = np.zeros((1, 2, 6, 4), np.float32)
    for call, match in [
            (lambda: audio_latent_frames(0, 24), "num_frames=0"),
            (lambda: audio_latent_frames(121, 0), "frame_rate=0"),
            (lambda: audio_latent_frames(121, float("nan")), "frame_rate=nan"),
            (lambda: audio_latent_frames(1, 100), "less than half of one audio latent frame"),
            (lambda: pack_audio_latents(z[0]), r"\[B, C, A, M\]"),
            (lambda: unpack_audio_latents(np.zeros((1, 6, 9), np.float32), 4), r"C\*4"),
            (lambda: unpack_audio_latents(np.zeros((1, 6, 8), np.float32), 4, 5),
             "latent_length=5"),
            (lambda: denormalize_audio_latents(z, np.zeros(8), np.ones(8)), "pack")]:
        with pytest.raises(RequestError, match=match):
            call()
