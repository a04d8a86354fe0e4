"""A diffusers-saved ``WanVideoToVideoPipeline`` folder loads as saved: ``ditax.load_pipeline``
gives the video-to-video pipeline, equal to diffusers' reading the same folder
(``WanVideoToVideoPipeline.from_pretrained``, the same noise); ``ditax generate --model FOLDER
--video IN.mp4`` runs it (``--strength`` optional: diffusers' 0.8) and, without ``--video``,
refuses in one line before any weights."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

import ditax  # noqa: E402
from ditax.pipelines.sampling import initial_noise  # noqa: E402
from ditax.pipelines.wan.video_to_video import WanVideoToVideo  # noqa: E402
from pipeline_reference import make_tiny_pipeline  # noqa: E402

H = W = 32
FRAMES = 5
REQ = dict(prompt="a dog runs along the beach at sunset", negative_prompt="blurry",
           num_inference_steps=4, guidance_scale=4.0, seed=5)
TOL = 1e-3        # as the WanPipeline-folder video-to-video parity test


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A tiny random ``WanVideoToVideoPipeline`` saved by diffusers (``save_pretrained``)."""
    from diffusers import WanVideoToVideoPipeline

    tmp = tmp_path_factory.mktemp("v2v_folder")
    ref, _ = make_tiny_pipeline(tmp, layers=1)
    v2v = WanVideoToVideoPipeline(tokenizer=ref.tokenizer, text_encoder=ref.text_encoder,
                                  vae=ref.vae, transformer=ref.transformer,
                                  scheduler=ref.scheduler)
    v2v.save_pretrained(tmp / "v2v")
    return tmp / "v2v"


def source_video(seed: int) -> np.ndarray:
    """A blocky random video ``[F, H, W, 3]`` in [0, 1] (8x8 blocks, a little noise)."""
    rng = np.random.default_rng(seed)
    blocks = rng.uniform(0.2, 0.8, (1, H // 8, W // 8, 3))
    v = blocks.repeat(8, 1).repeat(8, 2) + 0.04 * rng.standard_normal((FRAMES, H, W, 3))
    return np.clip(v, 0.0, 1.0).astype(np.float32)


def diffusers_video(folder, video, strength: float, noise) -> np.ndarray:
    """diffusers' ``WanVideoToVideoPipeline`` read from ``folder``, its noise draw replaced
    by ``noise`` (ditax's from the seed)."""
    import diffusers

    module = diffusers.pipelines.wan.pipeline_wan_video2video
    pipe = diffusers.WanVideoToVideoPipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    saved = module.randn_tensor
    module.randn_tensor = lambda shape, **_: torch.from_numpy(np.array(noise)).reshape(shape)
    kw = {k: v for k, v in REQ.items() if k != "seed"}
    try:
        with torch.no_grad():
            out = pipe(video=list(video), strength=strength, height=H, width=W,
                       output_type="np", **kw)
    finally:
        module.randn_tensor = saved
    return np.asarray(out.frames[0], np.float32)


def test_folder_loads_as_video_to_video_and_matches_diffusers(folder):
    import json

    assert json.loads((folder / "model_index.json").read_text())["_class_name"] == \
        "WanVideoToVideoPipeline"
    pipe = ditax.load_pipeline(folder)
    assert isinstance(pipe, WanVideoToVideo)
    video = source_video(1)
    got = pipe(video=video, strength=0.75, progress=False, **REQ)
    assert pipe.last_stats["steps"] == 3                   # int(4 * 0.75) of 4 steps
    assert got.shape == (FRAMES, H, W, 3)
    noise = initial_noise(REQ["seed"], pipe.latent_shape(H, W, FRAMES))
    want = diffusers_video(folder, video, 0.75, noise)
    err = float(np.abs(np.asarray(got) - want).max())
    print(f"WanVideoToVideoPipeline folder, strength 0.75: max abs diff vs diffusers {err:.2e}")
    assert err < TOL, err
    # asked for explicitly, as for a WanPipeline folder: the same pipeline
    assert isinstance(ditax.load_pipeline(folder, video_to_video=True), WanVideoToVideo)


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    from ditax.io.video import write_mp4

    path = tmp_path_factory.mktemp("v2v_clip") / "in.mp4"
    write_mp4(path, source_video(2))
    return path


@pytest.mark.parametrize("strength", [[], ["--strength", "0.5"]], ids=["default", "0.5"])
def test_generate_runs_the_folder(folder, clip, tmp_path, strength):
    from ditax.cli import main

    out = tmp_path / "out.mp4"
    assert main(["generate", "--model", str(folder), "--prompt", "a dog", "--video", str(clip),
                 *strength, "--steps", "2", "--guidance", "1", "--output", str(out),
                 "--no-progress"]) == 0
    from ditax.io.video import read_video

    frames = read_video(out)
    assert frames.shape == (FRAMES, H, W, 3)


def test_generate_without_a_source_video_is_refused(folder, capsys, tmp_path):
    from ditax.cli import main

    rc = main(["generate", "--model", str(folder), "--prompt", "a dog", "--steps", "2",
               "--output", str(tmp_path / "o.mp4")])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert rc == 2 and len(err) == 1, err
    assert "WanVideoToVideoPipeline" in err[0] and "--video IN.mp4" in err[0], err
