"""LTX-2's two-stage sampling: ``ditax.load_pipeline`` on a diffusers
``LTX2LatentUpsamplePipeline`` folder gives diffusers' upsampled latents (AdaIN and tone
mapping on) and decoded video; the whole chain (stage 1 at half size, the upsampler, stage 2
on the distilled sigmas, re-noised) gives diffusers' same chain from the same latents; bad
requests are one line; ``ditax generate --upsampler`` writes the full-size video."""

from unittest import mock

import numpy as np
import pytest

import ditax
from ditax.errors import RequestError
from ltx2_pipeline_reference import random_latents, shared_ltx2_pipeline
from ltx2_upsampler_reference import write_upsample_pipeline
from wan_reference import rel_err

PROMPT = "a drummer on a beach at sunset"
#: stage 1 at 32x32 (4x4 latents of the tiny 8x VAE), the video at 64x64; CFG and modality
#: guidance on, spatio-temporal guidance off (the tiny model's 2 blocks)
CALL = dict(num_frames=9, frame_rate=24.0, num_inference_steps=2, guidance_scale=3.0,
            stg_scale=0.0, max_sequence_length=16, decode_timestep=0.05, decode_noise_scale=0.0)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root, ref = shared_ltx2_pipeline()
    up_root = tmp_path_factory.mktemp("ltx2_up") / "up"
    ref_up = write_upsample_pipeline(up_root, ref.vae, seed=2)
    return ref, ref_up, ditax.load_pipeline(root), ditax.load_pipeline(up_root), up_root


def test_upsample_pipeline_equals_diffusers(tiny):
    """Normalised latents in, AdaIN 0.5 and tone mapping 0.6 on: the upsampled latents
    within 1e-5 (measured 8e-7); ``output="video"``: the decoded frames within 1e-5 (5e-7),
    and the same with the decode's rows split over 4 devices."""
    import torch

    _, ref_up, pipe, up, _ = tiny
    z = np.random.default_rng(1).standard_normal((1, 8, 3, 4, 4)).astype(np.float32) * 2
    opts = dict(latents_normalized=True, adain_factor=0.5, tone_map_compression_ratio=0.6)
    with torch.no_grad():
        want = ref_up(latents=torch.from_numpy(z), output_type="latent", return_dict=False,
                      **opts)[0].numpy()
        want_video = ref_up(latents=torch.from_numpy(z), output_type="np", return_dict=False,
                            decode_timestep=0.05, decode_noise_scale=0.0, **opts)[0]
    got = up(z, **opts)
    assert got.shape == want.shape == (1, 8, 3, 8, 8)
    assert rel_err(got, want) <= 1e-5, rel_err(got, want)
    video = up(z, output="video", decode_timestep=0.05, decode_noise_scale=0.0, **opts)
    assert video.shape == want_video[0].shape == (9, 64, 64, 3)
    assert rel_err(video, want_video[0]) <= 1e-5, rel_err(video, want_video[0])
    # vae_parallel (load_pipeline's vae_parallel=True with a mesh): the rows split over 4
    # devices give the same video
    import jax

    from ditax.models.vae import ltx2_parallel

    up.vae_parallel = ditax.make_mesh(dict(context=4), devices=jax.devices()[:4])
    programs = ltx2_parallel.decode_program._cache_size()
    try:
        split = up(z, output="video", decode_timestep=0.05, decode_noise_scale=0.0, **opts)
    finally:
        up.vae_parallel = None
    assert ltx2_parallel.decode_program._cache_size() == programs + 1   # the row-split ran
    np.testing.assert_allclose(split, video, atol=2e-6)


def test_two_stages_equal_diffusers_chain(tiny):
    """Stage 1 (2 steps at 32x32) → the upsampler → stage 2 (diffusers'
    ``STAGE_2_DISTILLED_SIGMA_VALUES`` as they are, re-noised by the first, guidance 1) at
    64x64, against diffusers' documented chain from the same start latents, its stage-2 noise
    being ours (its ``randn_tensor`` handed our draw): video and sound within 1e-5 (measured
    3e-7 / 4e-7)."""
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, LTX2Pipeline
    from diffusers.pipelines.ltx2.utils import STAGE_2_DISTILLED_SIGMA_VALUES

    from ditax.pipelines.ltx2.two_stage import STAGE_2_SIGMAS
    from ditax.pipelines.sampling import initial_noise

    assert list(STAGE_2_SIGMAS) == STAGE_2_DISTILLED_SIGMA_VALUES
    ref, ref_up, pipe, up, _ = tiny
    video_latents, audio_latents = random_latents(pipe, CALL["num_frames"], 32, 32,
                                                  CALL["frame_rate"])
    out = pipe(PROMPT, height=64, width=64, seed=0, latents=video_latents,
               audio_latents=audio_latents, upsampler=up, progress=False, **CALL)
    assert out["video"].shape == (9, 64, 64, 3)

    # diffusers: the same chain, the stage-2 noise ours (seed + 1, both streams in one draw)
    f, y, x = pipe.grid(9, 64, 64)
    lv = f * y * x * pipe.vae.latent_channels
    la = pipe.audio_frames(9, 24.0)
    ca = pipe.transformer.config.audio_in_channels
    noise = np.asarray(initial_noise(1, (1, lv + la * ca)), np.float32)
    draws = [noise[:, :lv].reshape(1, f * y * x, -1), noise[:, lv:].reshape(1, la, ca)]

    def ours(shape, **_):
        return torch.from_numpy(draws.pop(0)) if draws else torch.zeros(shape)

    torch_call = {k: v for k, v in CALL.items() if k != "num_inference_steps"}
    with torch.no_grad():
        v1, a1 = ref(prompt=PROMPT, latents=torch.from_numpy(video_latents),
                     audio_latents=torch.from_numpy(audio_latents), height=32, width=32,
                     num_inference_steps=2, output_type="latent", return_dict=False,
                     **torch_call)
        v_up = ref_up(latents=v1, output_type="latent", return_dict=False)[0]
        stage_2 = LTX2Pipeline(**{**ref.components,
                                  "scheduler": FlowMatchEulerDiscreteScheduler.from_config(
                                      ref.scheduler.config, use_dynamic_shifting=False,
                                      shift_terminal=None)})
        stage_2.set_progress_bar_config(disable=True)
        with mock.patch("diffusers.pipelines.ltx2.pipeline_ltx2.randn_tensor", ours):
            want_video, want_audio = stage_2(
                prompt=PROMPT, latents=v_up, audio_latents=a1, height=64, width=64,
                num_inference_steps=3, sigmas=STAGE_2_DISTILLED_SIGMA_VALUES,
                noise_scale=STAGE_2_DISTILLED_SIGMA_VALUES[0], output_type="np",
                return_dict=False, **{**torch_call, "guidance_scale": 1.0})
    assert not draws, "diffusers drew no stage-2 noise"
    want_video, want_audio = np.asarray(want_video[0], np.float32), want_audio[0].float().numpy()
    assert rel_err(out["video"], want_video) <= 1e-5, rel_err(out["video"], want_video)
    assert rel_err(out["audio"].samples, want_audio) <= 1e-5, \
        rel_err(out["audio"].samples, want_audio)
    assert pipe.last_stats["steps"] == 3


def test_bad_requests_are_one_line(tiny):
    _, _, pipe, up, _ = tiny
    for call, words in (
            (dict(height=40, width=64, upsampler=up), "height=40: two-stage sampling makes "
                                                      "stage 1 at height x 1/2"),
            (dict(height=64, width=64, upsampler=up, stage_2=dict(height=64)),
             "stage_2 ['height']"),
            (dict(height=64, width=64, upsampler=up, stage_2=dict(adain=1.0)),
             "stage_2 ['adain']: no argument"),
            (dict(height=32, width=32, noise_scale=0.5), "noise_scale=0.5 re-noises given"),
            (dict(height=32, width=32, noise_scale=1.5), "noise_scale=1.5 is outside [0, 1]")):
        with pytest.raises(RequestError) as e:
            pipe(PROMPT, progress=False, **{**CALL, **call})
        assert words in str(e.value) and "\n" not in str(e.value), (call, e.value)
    for kwargs, words in ((dict(tone_map_compression_ratio=2.0), "outside [0, 1]"),
                          (dict(adain_factor=-11.0), "outside [-10, 10]")):
        with pytest.raises(RequestError, match=r".*") as e:
            up(np.zeros((1, 8, 2, 4, 4), np.float32), **kwargs)
        assert words in str(e.value), e.value
    with pytest.raises(RequestError, match=r"unpacked video latents \[B, 8, F, Y, X\]"):
        up(np.zeros((1, 16, 8), np.float32))


def test_generate_with_upsampler(tiny, tmp_path, capsys):
    """``ditax generate --upsampler FOLDER`` with the upsampler model's folder alone (run with
    the LTX-2 folder's VAE, as diffusers' docs load it): the mp4 at the full size asked for."""
    from ditax.cli import main
    from ditax.io.video import read_video

    ref, _, _, _, up_root = tiny
    root, _ = shared_ltx2_pipeline()
    out = tmp_path / "two.mp4"
    rc = main(["generate", "--model", str(root), "--prompt", PROMPT, "--output", str(out),
               "--height", "64", "--width", "64", "--frames", "9", "--steps", "2",
               "--upsampler", str(up_root / "latent_upsampler"), "--no-audio", "--no-progress",
               "sample.max_sequence_length=16"])
    assert rc == 0, capsys.readouterr().err
    assert read_video(out).shape == (9, 64, 64, 3)
