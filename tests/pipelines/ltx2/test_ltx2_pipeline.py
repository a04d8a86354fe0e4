"""LTX-2 text-to-video with sound: ``ditax.load_pipeline`` on a diffusers ``LTX2Pipeline``
folder gives diffusers' video and waveform from the same latents (every guidance term on:
per-stream CFG, spatio-temporal guidance, modality isolation, rescaling); bad requests are
one line."""

import numpy as np
import pytest

import ditax
from ditax.errors import RequestError
from ditax.io.audio import AudioTrack
from ltx2_pipeline_reference import random_latents, run_diffusers, shared_ltx2_pipeline
from wan_reference import rel_err

PROMPT = "a drummer on a beach at sunset"
SIZE = dict(height=32, width=32, num_frames=5, frame_rate=24.0)


@pytest.fixture(scope="module")
def tiny():
    root, ref = shared_ltx2_pipeline()
    return root, ref, ditax.load_pipeline(root)


def _latents(pipe, seed=0):
    """Unpacked video ``[1, C, F', Y, X]`` and audio ``[1, c, La, M]`` latents for SIZE."""
    return random_latents(pipe, SIZE["num_frames"], SIZE["height"], SIZE["width"],
                          SIZE["frame_rate"], seed)


def test_same_latents_give_diffusers_video_and_sound(tiny):
    """All of diffusers' guidance terms at once (its defaults but STG on block 1 of 2 and
    3 steps) from the same unpacked latents: the video and the waveform within 1e-5 (measured
    4e-7 / 6e-7; each term moves them by 1e-3 .. 2e-1, so none can be dropped unseen)."""
    root, ref, pipe = tiny
    video_latents, audio_latents = _latents(pipe)
    call = dict(SIZE, num_inference_steps=3, guidance_scale=3.0, audio_guidance_scale=7.0,
                stg_scale=1.0, modality_scale=3.0, guidance_rescale=0.7, max_sequence_length=16,
                decode_timestep=0.05, decode_noise_scale=0.0)
    want_video, want_audio = run_diffusers(ref, PROMPT, video_latents, audio_latents,
                                           spatio_temporal_guidance_blocks=[1], **call)
    out = pipe(PROMPT, latents=video_latents, audio_latents=audio_latents, stg_blocks=(1,),
               progress=False, **call)
    assert out["video"].shape == want_video.shape == (5, 32, 32, 3)
    assert rel_err(out["video"], want_video) <= 1e-5, rel_err(out["video"], want_video)
    track = out["audio"]
    assert isinstance(track, AudioTrack) and track.sample_rate == 8000
    assert track.samples.shape == want_audio.shape
    assert rel_err(track.samples, want_audio) <= 1e-5, rel_err(track.samples, want_audio)
    assert pipe.last_stats["steps"] == 3
    # four forwards a step: conditional, unconditional, STG-perturbed, modality-isolated
    assert pipe.last_stats["transformer_calls"] == 3 * 4
    assert set(pipe.last_stats["computed_steps"]) == {"cond", "uncond", "stg", "modality"}

    # vae_parallel (what load_pipeline sets from vae_parallel=True with a mesh): the video
    # decoded with its rows split over 4 devices, the reflection-padded decoder's frame edges
    # mirrored, equals the one-device decode
    import jax

    from ditax.parallel.mesh import make_mesh

    from ditax.models.vae import ltx2_parallel

    pipe.vae_parallel = make_mesh(dict(context=4), devices=jax.devices()[:4])
    programs = ltx2_parallel.decode_program._cache_size()
    try:
        split = pipe(PROMPT, latents=video_latents, audio_latents=audio_latents,
                     stg_blocks=(1,), progress=False, **call)["video"]
    finally:
        pipe.vae_parallel = None
    assert ltx2_parallel.decode_program._cache_size() == programs + 1   # the row-split ran
    np.testing.assert_allclose(split, out["video"], atol=2e-6)


def test_bad_requests_are_one_line(tiny):
    _, _, pipe = tiny
    for kwargs, words in ((dict(num_frames=6), "num_frames=6 must be 4k+1"),
                          (dict(height=20), "height=20 must be a positive multiple of 8"),
                          (dict(stg_blocks=(5,)), "[5] are no block indices of this model"),
                          (dict(num_inference_steps=1), "use 2 steps or more"),
                          (dict(latents=np.zeros((1, 8, 2, 4, 4), np.float32)),
                           "latents and audio_latents go together")):
        with pytest.raises(RequestError, match=r".*") as e:
            pipe(PROMPT, progress=False, **{**SIZE, **kwargs})
        assert words in str(e.value) and "\n" not in str(e.value), (kwargs, e.value)


def test_generate_writes_the_mp4_with_its_sound_track(tiny, tmp_path, capsys):
    """``ditax generate`` on the folder: an mp4 whose AAC track ffmpeg reads back at the
    vocoder's rate and the video's length; ``--no-audio``: the same frames, silent."""
    from ditax.cli import main
    from ditax.io.audio import read_audio
    from ditax.io.video import read_video

    root, _, _ = tiny
    out = tmp_path / "drums.mp4"
    flags = ["--height", "32", "--width", "32", "--frames", "9", "--steps", "2",
             "--frame-rate", "12", "--no-progress", "sample.max_sequence_length=16"]
    rc = main(["generate", "--model", str(root), "--prompt", PROMPT, "--output", str(out),
               *flags])
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    # the mp4 at the rate the video was made for, its sound as long as its 9 frames
    assert "12 fps, 2-channel 8000 Hz AAC sound track" in printed.out, printed.out
    frames = read_video(out)
    track = read_audio(out)
    assert frames.shape == (9, 32, 32, 3)
    assert track.sample_rate == 8000 and track.channels == 2
    assert abs(track.seconds - 9 / 12) < 0.1, track.seconds
    silent = tmp_path / "silent.mp4"
    rc = main(["generate", "--model", str(root), "--prompt", PROMPT, "--output", str(silent),
               "--no-audio", *flags])
    assert rc == 0, capsys.readouterr().err
    assert read_audio(silent) is None
    np.testing.assert_array_equal(read_video(silent), frames)


def test_image_to_video_equals_diffusers(tiny):
    """``LTX2ImageToVideoPipeline``: from the same latents the first latent frame stays the
    given one (timestep 0 on its tokens, never stepped) and the video and sound equal
    diffusers'; without latents the image's first frame is its VAE latent as diffusers' own
    ``prepare_latents`` makes it (re-compression off: diffusers runs it through PyAV)."""
    import PIL.Image
    import torch
    from diffusers import LTX2ImageToVideoPipeline

    _, ref, pipe = tiny
    i2v = LTX2ImageToVideoPipeline(**ref.components)
    i2v.set_progress_bar_config(disable=True)
    rng = np.random.default_rng(3)
    image = PIL.Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8))
    video_latents, audio_latents = _latents(pipe, seed=1)
    call = dict(SIZE, num_inference_steps=2, guidance_scale=3.0, stg_scale=0.0,
                modality_scale=2.0, max_sequence_length=16, decode_timestep=0.05,
                decode_noise_scale=0.0)
    want_video, want_audio = run_diffusers(i2v, PROMPT, video_latents, audio_latents,
                                           image=image, image_crf=0, **call)
    out = pipe(PROMPT, image=image, latents=video_latents, audio_latents=audio_latents,
               image_crf=0, progress=False, **call)
    assert rel_err(out["video"], want_video) <= 1e-5, rel_err(out["video"], want_video)
    assert rel_err(out["audio"].samples, want_audio) <= 1e-5
    t2v = pipe(PROMPT, latents=video_latents, audio_latents=audio_latents, progress=False,
               **call)                                  # the same latents, no conditioning
    assert rel_err(t2v["video"], want_video) > 1e-3

    pixels = torch.from_numpy(np.asarray(image, np.float32)[None].transpose(0, 3, 1, 2)
                              / 127.5 - 1.0)
    with torch.no_grad():
        want, _ = i2v.prepare_latents(pixels, 1, pipe.vae.latent_channels, 32, 32, 5,
                                      generator=torch.Generator().manual_seed(0))
    f, y, x = pipe.grid(5, 32, 32)
    prepared = pipe.prepare(PROMPT, image=image, image_crf=0, **{
        k: call[k] for k in ("height", "width", "num_frames")})
    start = np.asarray(prepared.latents)[:, :y * x * pipe.vae.latent_channels]
    assert rel_err(start, want.numpy()[:, :y * x].reshape(1, -1)) <= 1e-5
    with pytest.raises(RequestError, match="image_crf=52 must be an int in 0..51"):
        pipe.prepare(PROMPT, image=image, image_crf=52)
