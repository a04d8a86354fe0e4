"""Wan 2.2 Animate pipeline vs diffusers' WanAnimatePipeline on a tiny random folder saved in
its own format (UMT5, Wan 2.1 VAE, CLIP, the Animate transformer): ``mode="animate"`` over two
segments (the second conditioned on the first's last decoded frame) and ``mode="replace"``
(background + mask), the same noise per segment; classifier-free guidance (the unconditional
branch: negative prompt and a blank face); the bad requests (no pose
video, replace without its videos, a segment length that is not 4k+1)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

import ditax  # noqa: E402
from ditax.errors import RequestError  # noqa: E402
from ditax.pipelines.wan.animate import WanAnimate  # noqa: E402
from animate_reference import diffusers_animate, make_tiny_animate  # noqa: E402
from i2v_reference import Z, image  # noqa: E402

H = W = 32
SEG = 5
REQ = dict(prompt="a cat walks on the grass", height=H, width=W, segment_frame_length=SEG,
           num_inference_steps=2, guidance_scale=1.0, prev_segment_conditioning_frames=1)
TOL = 1e-3


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    ref, folder = make_tiny_animate(tmp_path_factory.mktemp("animate"))
    return ref, ditax.load_pipeline(folder), folder


def _videos(n, seed=0):
    rng = np.random.default_rng(seed)
    pose = [image(int(s), H, W) for s in rng.integers(0, 1000, n)]
    face = [image(int(s), 16, 16) for s in rng.integers(0, 1000, n)]
    return pose, face


def test_animate_two_segments_and_replace_match_diffusers(tiny):
    ref, pipe, _ = tiny
    assert isinstance(pipe, WanAnimate)
    shape = (1, Z, 3, H // 8, W // 8)
    char = image(7, H, W)
    pose, face = _videos(9)                      # 9 frames: two segments of 5, 1 overlapping
    got = pipe(image=char, pose_video=pose, face_video=face, seed=2, progress=False, **REQ)
    want = diffusers_animate(ref, shape, 2, [0, 1], image=char, pose_video=pose, face_video=face,
                      **REQ)
    err = float(np.abs(got - want).max())
    print(f"animate, 2 segments: max abs diff vs diffusers {err:.2e}")
    assert got.shape == want.shape == (9, H, W, 3)
    assert err < TOL, err
    # replace: a background video and a mask (white = the person, generated)
    bg = [image(50 + i, H, W) for i in range(5)]
    mask = np.zeros((H, W, 3), np.float32)
    mask[8:24, 8:20] = 1.0
    masks = [PIL_image(mask)] * 5
    kw = dict(REQ, image=char, pose_video=pose[:5], face_video=face[:5], mode="replace",
              background_video=bg, mask_video=masks)
    got_r = pipe(seed=4, progress=False, **kw)
    want_r = diffusers_animate(ref, shape, 4, [0], **kw)
    err_r = float(np.abs(got_r - want_r).max())
    print(f"replace, 1 segment: max abs diff vs diffusers {err_r:.2e}")
    assert err_r < TOL, err_r
    assert np.abs(got_r - got[:5]).max() > 1e-2        # the background changes the video


def test_animate_guidance_matches_diffusers(tiny):
    """``guidance_scale > 1``: the unconditional branch takes the negative prompt and the face
    crops all -1, as diffusers' (the batched loop: one batch-2 forward; the sequential one
    runs the same rule, :func:`ditax.pipelines.denoise.cfg_branches`)."""
    ref, pipe, _ = tiny
    shape = (1, Z, 3, H // 8, W // 8)
    pose, face = _videos(5, seed=1)
    kw = dict(REQ, image=image(7, H, W), pose_video=pose, face_video=face, guidance_scale=3.0,
              negative_prompt="blurry")
    got = pipe(seed=5, progress=False, **kw)
    want = diffusers_animate(ref, shape, 5, [0], **kw)
    err = float(np.abs(got - want).max())
    print(f"animate, guidance 3: max abs diff vs diffusers {err:.2e}")
    assert err < TOL, err
    t = pipe.timings     # the whole call's phases (CLIP / VAE encodes are "image")
    assert min(t.text, t.image, t.denoise, t.decode) > 0, t


def test_first_block_cache_carries_pose_and_face(tiny):
    """Step caching on Animate: ``cache="first_block"`` with threshold 0 skips nothing and
    gives the plain video (the cached step's forward gets the pose latents and face crops);
    a threshold nothing reaches reuses step 0's residual after it (another video)."""
    _, pipe, _ = tiny
    pose, face = _videos(5, seed=2)
    kw = dict(REQ, image=image(7, H, W), pose_video=pose, face_video=face, seed=3,
              progress=False)
    plain = pipe(**kw)
    none_skipped = pipe(cache="first_block", cache_threshold=0.0, **kw)
    assert pipe.last_stats["transformer_calls"] == 2, pipe.last_stats
    assert pipe.last_stats["skipped_steps"] == {"cond": []}, pipe.last_stats
    err = float(np.abs(none_skipped - plain).max())
    print(f"animate first_block threshold 0 vs plain: max abs diff {err:.2e}")
    assert err < 1e-5, err
    skipped = pipe(cache="first_block", cache_threshold=1e9, **kw)
    assert pipe.last_stats["skipped_steps"] == {"cond": [1]}, pipe.last_stats
    assert np.abs(skipped - plain).max() > 1e-3


def PIL_image(x):
    import PIL.Image

    return PIL.Image.fromarray((np.asarray(x) * 255).round().astype(np.uint8))


@pytest.mark.parametrize("change,match", [
    (dict(pose_video=None), "Wan Animate needs pose_video="),
    (dict(face_video=None), "Wan Animate needs face_video="),
    (dict(mode="replace"), "mode='replace' needs background_video= and mask_video="),
    (dict(mode="swap"), "mode='swap' must be 'animate' or 'replace'"),
    (dict(segment_frame_length=6), r"segment_frame_length=6 must be of the form 4k\+1"),
    (dict(prev_segment_conditioning_frames=5), r"prev_segment_conditioning_frames=5 must be"),
    (dict(image=image(1, 48, 32)), "image is 32x48 but the video is 32x32"),
])
def test_bad_requests(tiny, change, match):
    _, pipe, _ = tiny
    pose, face = _videos(5)
    kw = dict(REQ, image=image(7, H, W), pose_video=pose, face_video=face, progress=False)
    kw.update(change)
    with pytest.raises(RequestError, match=match):
        pipe(**kw)


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """The character PNG and 5-frame pose (32x32) / face (16x16) mp4s the CLI reads."""
    from ditax.io.video import write_mp4

    tmp = tmp_path_factory.mktemp("animate_clips")
    image(7, H, W).save(tmp / "ref.png")
    pose, face = _videos(5)
    mask = np.zeros((5, H, W, 3), np.float32)
    mask[:, 8:24, 8:20] = 1.0
    bg = [image(50 + i, H, W) for i in range(5)]
    write_mp4(tmp / "mask.mp4", mask)
    for name, fr in (("pose", pose), ("face", face), ("bg", bg)):
        write_mp4(tmp / f"{name}.mp4", np.stack([np.asarray(f, np.float32) / 255 for f in fr]))
    return tmp


def test_cli_animate_equals_the_python_call(tiny, clips, tmp_path, capsys):
    """``ditax generate --image --pose-video --face-video`` writes the video the pipeline call
    gives on the same (mp4-decoded) inputs and seed: the PNG frames to one grey level, the
    mp4 within H.264's loss."""
    from ditax.cli import main
    from ditax.io.images import read_image
    from ditax.io.video import read_video, to_uint8

    _, pipe, folder = tiny
    out, frames = tmp_path / "o.mp4", tmp_path / "frames"
    rc = main(["generate", "--model", str(folder), "--prompt", REQ["prompt"], "--image",
               str(clips / "ref.png"), "--pose-video", str(clips / "pose.mp4"), "--face-video",
               str(clips / "face.mp4"), "--segment-frame-length", str(SEG),
               "--prev-segment-frames", "1", "--steps", "2", "--seed", "2", "--no-progress",
               "--output", str(out), "--frames-dir", str(frames)])
    assert rc == 0, capsys.readouterr().err
    want = to_uint8(pipe(image=read_image(clips / "ref.png"), seed=2, progress=False,
                         pose_video=read_video(clips / "pose.mp4") / 255.0,
                         face_video=read_video(clips / "face.mp4") / 255.0, **REQ))
    import imageio.v2 as imageio

    png = np.stack([imageio.imread(f) for f in sorted(frames.glob("frame_*.png"))])
    assert png.shape == want.shape == (5, H, W, 3)
    assert np.abs(png.astype(int) - want.astype(int)).max() <= 1
    assert np.abs(read_video(out).astype(np.float32) - want).mean() < 6.0
    # --mode replace: the background and mask videos reach the call as background_video= /
    # mask_video= (the PNG frames, as above)
    rc = main(["generate", "--model", str(folder), "--prompt", REQ["prompt"], "--image",
               str(clips / "ref.png"), "--pose-video", str(clips / "pose.mp4"), "--face-video",
               str(clips / "face.mp4"), "--mode", "replace", "--background-video",
               str(clips / "bg.mp4"), "--mask-video", str(clips / "mask.mp4"),
               "--segment-frame-length", str(SEG), "--steps", "2", "--seed", "4",
               "--no-progress", "--output", str(tmp_path / "r.mp4"), "--frames-dir",
               str(tmp_path / "r")])
    assert rc == 0, capsys.readouterr().err
    want_r = to_uint8(pipe(image=read_image(clips / "ref.png"), seed=4, progress=False,
                           pose_video=read_video(clips / "pose.mp4") / 255.0,
                           face_video=read_video(clips / "face.mp4") / 255.0, mode="replace",
                           background_video=read_video(clips / "bg.mp4") / 255.0,
                           mask_video=read_video(clips / "mask.mp4") / 255.0, **REQ))
    png_r = np.stack([imageio.imread(f) for f in sorted((tmp_path / "r").glob("frame_*.png"))])
    assert np.abs(png_r.astype(int) - want_r.astype(int)).max() <= 1
    assert np.abs(want_r.astype(int) - want.astype(int)).max() > 2     # replace differs


@pytest.mark.parametrize("index,extra,match", [
    ("WanAnimatePipeline", [], "is a Wan Animate folder; it needs --pose-video"),
    ("WanAnimatePipeline", ["--pose-video", "pose.mp4"], "it needs --face-video"),
    ("WanPipeline", ["--pose-video", "pose.mp4"], "--pose-video is a Wan Animate input, but"),
    ("WanPipeline", ["--segment-frame-length", "5"], "--segment-frame-length is a Wan Animate"),
    ("WanAnimatePipeline", ["--pose-video", "pose.mp4", "--frames", "5"],
     "--frames is not taken by Wan Animate"),
])
def test_cli_animate_refusals(clips, tmp_path, capsys, index, extra, match):
    """The Animate flags' refusals, in one line (exit 2) before any weights load (the folder
    has only its model_index.json)."""
    from ditax.cli import main

    (tmp_path / "model_index.json").write_text(f'{{"_class_name": "{index}"}}')
    extra = [str(clips / a) if a.endswith(".mp4") else a for a in extra]
    rc = main(["generate", "--model", str(tmp_path), "--prompt", "a cat", "--image",
               str(clips / "ref.png"), *extra,
               "--output", str(tmp_path / "o.mp4")])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert rc == 2 and len(err) == 1, err
    assert match in err[0], err
