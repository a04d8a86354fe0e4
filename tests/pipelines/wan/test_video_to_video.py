"""Video-to-video vs diffusers' WanVideoToVideoPipeline on a tiny random text-to-video folder
(the same noise: diffusers' draw replaced by ditax's from the seed): strength 0.6 of 5 UniPC
steps (the first 2 cut, order and corrector as diffusers'), the noised start given as latents=,
and the bad requests (frame count, size, strength, both or neither of video / latents)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

import ditax  # noqa: E402
from ditax.errors import RequestError  # noqa: E402
from ditax.pipelines.sampling import initial_noise  # noqa: E402
from ditax.pipelines.wan.video_to_video import WanVideoToVideo, start_step  # noqa: E402
from pipeline_reference import make_tiny_pipeline  # noqa: E402

H = W = 32
FRAMES = 5
REQ = dict(prompt="a cat walks on the grass", negative_prompt="blurry, low quality",
           num_inference_steps=5, guidance_scale=5.0, seed=3)
TOL = 1e-3


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    ref, folder = make_tiny_pipeline(tmp_path_factory.mktemp("v2v"), layers=1)
    return ref, folder, ditax.load_pipeline(folder, video_to_video=True)


def _video(seed, frames=FRAMES, h=H, w=W):
    """A smooth random source video [F, H, W, 3] in [0, 1]."""
    rng = np.random.default_rng(seed)
    base = rng.uniform(0.2, 0.8, (1, h // 8, w // 8, 3))
    v = np.repeat(np.repeat(base, 8, 1), 8, 2) + 0.05 * rng.standard_normal((frames, h, w, 3))
    return np.clip(v, 0, 1).astype(np.float32)


def _diffusers(ref, video, strength, seed, shape, **kw):
    import diffusers
    from diffusers import WanVideoToVideoPipeline

    mod = diffusers.pipelines.wan.pipeline_wan_video2video
    pipe = WanVideoToVideoPipeline(tokenizer=ref.tokenizer, text_encoder=ref.text_encoder,
                                   vae=ref.vae, transformer=ref.transformer,
                                   scheduler=type(ref.scheduler).from_config(ref.scheduler.config))
    pipe.set_progress_bar_config(disable=True)
    noise = torch.from_numpy(np.array(initial_noise(seed, shape)))
    orig = mod.randn_tensor
    mod.randn_tensor = lambda s, **_: noise.reshape(s)
    try:
        with torch.no_grad():
            out = pipe(video=video, strength=strength, height=H, width=W, output_type="np", **kw)
    finally:
        mod.randn_tensor = orig
    return np.asarray(out.frames[0], np.float32)


def test_matches_diffusers_and_latents_start(tiny):
    ref, _, pipe = tiny
    assert isinstance(pipe, WanVideoToVideo)
    video = _video(0)
    mine = pipe(video=video, strength=0.6, progress=False, output="latent", **REQ)
    assert pipe.last_stats["steps"] == 3          # int(5 * 0.6) steps of 5 run
    got = pipe.decode_video(mine)
    assert got.shape == (FRAMES, H, W, 3)
    shape = pipe.latent_shape(H, W, FRAMES)
    kw = {k: v for k, v in REQ.items() if k != "seed"}
    want = _diffusers(ref, video, 0.6, REQ["seed"], shape, **kw)
    err = float(np.abs(got - want).max())
    print(f"v2v strength 0.6 (UniPC, 3 of 5 steps): max abs diff vs diffusers {err:.2e}")
    assert err < TOL, err
    # latents= is the noised start itself (diffusers' meaning): the source noised by hand
    from ditax.models.wan.conditioning import encode_normalized

    frames = np.transpose(video * 2 - 1, (3, 0, 1, 2))[None]
    state = pipe.scheduler.from_step(pipe.scheduler.set_timesteps(5, shape), 2)
    start = pipe.scheduler.add_noise(state, encode_normalized(pipe.vae, frames),
                                     initial_noise(REQ["seed"], shape), 0)
    lat = pipe(latents=np.asarray(start), strength=0.6, height=H, width=W, num_frames=FRAMES,
               progress=False, output="latent", **REQ)
    np.testing.assert_allclose(lat, mine, atol=1e-5)


def test_start_step_rule():
    assert [start_step(50, s) for s in (1.0, 0.8, 0.6, 0.02)] == [0, 10, 20, 49]
    assert start_step(5, 0.6) == 2


@pytest.mark.parametrize("change,match", [
    (dict(strength=0.0), r"strength=0.0 must be a number in \(0, 1\]"),
    (dict(strength=1.5), r"strength=1.5 must be"),
    (dict(strength=0.1), r"keeps int\(5 \* 0.1\) = 0 steps"),
    (dict(video=_video(0, frames=6)), r"video has 6 frames; .*4k\+1 .*first 5"),
    (dict(num_frames=9), r"num_frames=9 but the video has 5 frames"),
    (dict(video=_video(0, h=40, w=40)), r"the video is 40x40; .*multiples of 16"),
    (dict(video=None), "exactly one of them"),
    (dict(latents=np.zeros((1, 4, 2, 4, 4), np.float32)), "exactly one of them"),
    (dict(video=np.zeros((5, 32, 32), np.float32)), r"video must be a float array \[F, H, W, 3\]"),
    (dict(image=np.zeros((32, 32, 3), np.float32)), "video-to-video takes no image"),
])
def test_bad_requests(tiny, change, match):
    _, _, pipe = tiny
    kw = dict(REQ, video=_video(0), strength=0.6, progress=False)
    kw.update(change)
    with pytest.raises(RequestError, match=match):
        pipe(**kw)


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """Two small mp4s (5 and 6 frames at 48x32) and a folder that names an image model."""
    from ditax.io.video import write_mp4

    d = tmp_path_factory.mktemp("clips")
    rng = np.random.default_rng(0)
    for n in (5, 6):
        write_mp4(d / f"in{n}.mp4", rng.uniform(size=(n, 32, 48, 3)).astype(np.float32))
    (d / "flux").mkdir()
    (d / "flux" / "model_index.json").write_text('{"_class_name": "FluxPipeline"}')
    return d


@pytest.mark.parametrize("flags,says", [
    (["--video", "in5.mp4"], r"is video-to-video: add --strength S"),
    (["--strength", "0.5"], r"--strength is video-to-video; give the source with --video"),
    (["--video", "in5.mp4", "--strength", "1.5"], r"strength=1.5 must be a number in \(0, 1\]"),
    (["--video", "in6.mp4", "--strength", "0.5"],
     r"--video .*in6.mp4 \(48x32, 6 frames\): num_frames=6 must be of the form 4k\+1"),
    (["--video", "in5.mp4", "--strength", "0.5", "--frames", "9"], "fewer than --frames 9"),
    (["--model", "flux", "--video", "in5.mp4", "--output", "x.png"],
     r"--video is not taken by flux models \(.*flux is a flux folder, it makes images\)"),
])
def test_cli_refuses_before_loading(clips, capsys, monkeypatch, flags, says):
    """``ditax generate --video IN --strength S``: each bad request exits 2 in one line before
    any weights load (the demo model is a text-to-video folder)."""
    import re

    from ditax.cli import main

    monkeypatch.chdir(clips)
    model = [] if "--model" in flags else ["--model", "demo"]
    rc = main(["generate", "--prompt", "a cat", "--output", "o.mp4", *model, *flags])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert rc == 2 and len(err) == 1 and re.search(says, err[0]), err


def test_step_cache_carries_the_source(tiny):
    """first_block step caching on video-to-video starts from the noised source and runs only
    the kept steps: with a huge threshold every step after the first reuses the cached
    residual. The tiny model has one block, so the first block is the whole model and the
    reuse is exact: the cached video equals the plain one (a cached path that lost the source
    or the start step would not)."""
    pipe = tiny[2]
    kw = dict(video=_video(4), strength=0.8, progress=False, output="latent", **REQ)
    plain = pipe(**kw)
    cached = pipe(cache="first_block", cache_threshold=1e9, **kw)
    stats = pipe.last_stats
    assert stats["steps"] == 4 and stats["skipped_steps"]["cond"] == [1, 2, 3], stats
    np.testing.assert_allclose(cached, plain, atol=1e-5)
