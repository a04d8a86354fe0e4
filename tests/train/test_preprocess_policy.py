"""Preprocessing drops nothing silently (issue 41, class 6), the resize policy and the sidecar
pre-pass: ``--resize crop`` (the default) scales a file of another aspect ratio to cover
``--width x --height`` and keeps the center, ``stretch`` squeezes it; videos, images and the
VACE control / mask sidecars alike (a mask resized nearest-neighbour stays binary); the
dataset's meta.json and the closing line say which and how many files it changed. Before any
encoding one pass refuses, naming each file: a file more than 4x smaller than the target on a
side, clips whose reference-image counts differ, a mask video with a non-binary frame."""

import json
import pathlib

import numpy as np
import PIL.Image

from ditax.cli import main

RED, GREEN, BLUE = (1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0)


def _bands(h: int, w: int) -> np.ndarray:
    """``[h, w, 3]`` in [0, 1]: red, green and blue vertical thirds."""
    x = np.zeros((h, w, 3))
    x[:, : w // 3], x[:, w // 3: 2 * w // 3], x[:, 2 * w // 3:] = RED, GREEN, BLUE
    return x


def _colour_at(video, x: int) -> tuple:
    """The rounded RGB of column ``x`` (middle row, first frame) of ``[3, F, H, W]`` in [-1, 1]."""
    rgb = (video[:, 0, video.shape[2] // 2, x] + 1) / 2
    return tuple(float(v) for v in np.round(rgb))


def test_crop_keeps_the_center_and_stretch_keeps_the_sides(tmp_path):
    from ditax.io.video import write_mp4
    from ditax.train.preprocess import read_video

    PIL.Image.fromarray((_bands(32, 96) * 255).astype(np.uint8)).save(tmp_path / "wide.png")
    write_mp4(tmp_path / "wide.mp4", np.repeat(_bands(32, 96)[None], 5, 0), fps=8)
    for name, frames in (("wide.png", 1), ("wide.mp4", 5)):
        crop = read_video(tmp_path / name, frames, 32, 32, resize="crop")
        stretch = read_video(tmp_path / name, frames, 32, 32, resize="stretch")
        assert crop.shape == stretch.shape == (3, frames, 32, 32)
        # crop: the middle third (green) scaled to cover 32 x 32 fills it; the sides are gone
        assert _colour_at(crop, 1) == _colour_at(crop, 30) == GREEN, name
        # stretch: all three bands squeezed in
        assert (_colour_at(stretch, 1), _colour_at(stretch, 16), _colour_at(stretch, 30)) == (
            RED, GREEN, BLUE), name


def test_sidecars_follow_the_policy_and_a_mask_stays_binary(tmp_path):
    from ditax.io.video import write_mp4
    from ditax.train.preprocess import read_sidecars, read_video

    rng = np.random.default_rng(0)
    write_mp4(tmp_path / "a.mp4", rng.uniform(0, 1, (5, 48, 144, 3)), fps=8)
    write_mp4(tmp_path / "a.control.mp4", np.repeat(_bands(48, 144)[None], 5, 0), fps=8)
    # a fine binary checkerboard: any smooth 2/3 downscale makes grey values of it
    cells = (np.add.outer(np.arange(48) // 3, np.arange(144) // 3) % 2).astype(np.float64)
    write_mp4(tmp_path / "a.mask.mp4", np.repeat(cells[None, ..., None], 5, 0).repeat(3, 3),
              fps=8)
    every = ("control", "mask", "references")
    side = read_sidecars(tmp_path / "a.mp4", every, 5, 32, 32, resize="crop")
    assert _colour_at(side["control"], 1) == _colour_at(side["control"], 30) == GREEN
    np.testing.assert_array_equal(side["control"],
                                  read_video(tmp_path / "a.control.mp4", 5, 32, 32, resize="crop"))
    m = (side["mask"] + 1) / 2
    assert side["mask"].shape == (3, 5, 32, 32)
    assert np.abs(m - np.round(m)).max() <= 0.1           # binary (VACE's 0.1 snap)
    assert 0.3 < np.round(m).mean() < 0.7                 # both values kept
    stretched = (read_sidecars(tmp_path / "a.mp4", every, 5, 32, 32, resize="stretch")["mask"]
                 + 1) / 2
    assert np.abs(stretched - np.round(stretched)).max() <= 0.1


def _folder(tmp_path) -> pathlib.Path:
    v = tmp_path / "videos"
    v.mkdir()
    return v


def _preprocess(v, out, *extra):
    return main(["preprocess", str(v), str(out), "--model", "demo", "--height", "32",
                 "--width", "32", "--frames", "1", "--text-len", "8", "--no-progress", *extra])


def test_the_policy_is_recorded_and_said(tmp_path, capsys):
    v = _folder(tmp_path)
    PIL.Image.fromarray((_bands(32, 96) * 255).astype(np.uint8)).save(v / "wide.png")
    PIL.Image.fromarray(np.full((48, 48, 3), 128, np.uint8)).save(v / "square.png")
    for name in ("wide", "square"):
        (v / f"{name}.txt").write_text(f"a {name} picture")
    for policy, verb in (("crop", "cropped"), ("stretch", "stretched")):
        out = tmp_path / policy
        args = () if policy == "crop" else ("--resize", "stretch")
        assert _preprocess(v, out, *args) == 0
        said = capsys.readouterr().out
        meta = json.loads((out / "meta.json").read_text())
        assert meta["resize"] == policy and meta["other_aspect_ratio"] == ["wide.png"], meta
        name = "crop (center)" if policy == "crop" else "stretch"
        assert f"resize={name}, 1 of 2 files {verb} from another aspect ratio" in said, said
    # a policy that does not exist: one line, before any work
    assert _preprocess(v, tmp_path / "fit", "--resize", "fit") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--resize='fit' is not one of crop, stretch" in err[0], err
    assert not (tmp_path / "fit").exists()


def test_tiny_files_are_refused_before_any_encoding(tmp_path, capsys):
    from ditax.io.video import write_mp4

    v = _folder(tmp_path)
    PIL.Image.fromarray(np.zeros((1, 1, 3), np.uint8)).save(v / "dot.png")
    PIL.Image.fromarray(np.zeros((8, 40, 3), np.uint8)).save(v / "four.png")   # 4x: kept
    write_mp4(v / "small.mp4", np.zeros((3, 6, 40, 3)), fps=8)                  # 6 < 32 / 4
    for name in ("dot", "four", "small"):
        (v / f"{name}.txt").write_text("x")
    assert _preprocess(v, tmp_path / "out") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    for words in ("2 problem(s) before any encoding",
                  "dot.png is 1x1 (WxH), more than 4x smaller than the target 32x32",
                  "small.mp4 is 40x6 (WxH), more than 4x smaller than the target 32x32"):
        assert words in err[0], (words, err[0])
    assert "four.png" not in err[0]
    assert not (tmp_path / "out").exists()


def test_reference_counts_that_differ_are_named_before_any_encoding(tmp_path, capsys):
    from ditax.io.video import write_mp4

    v = _folder(tmp_path)
    for name in ("a", "b", "c"):
        write_mp4(v / f"{name}.mp4", np.zeros((5, 32, 32, 3)), fps=8)
        (v / f"{name}.txt").write_text("x")
    for ref in ("a.ref.png", "c.ref.png"):
        PIL.Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(v / ref)
    rc = main(["preprocess", str(v), str(tmp_path / "out"), "--model", "demo", "--height", "32",
               "--width", "32", "--frames", "5", "--text-len", "8", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert ("b.mp4 has 0 reference image(s) where 2 other clip(s) have 1 (a.ref.png, "
            "c.ref.png)") in err[0], err[0]
    assert not (tmp_path / "out").exists()


def test_a_non_binary_mask_is_named_with_its_frame_before_any_encoding(tmp_path, capsys):
    from ditax.io.video import write_mp4

    v = _folder(tmp_path)
    mask = np.zeros((5, 32, 32, 3))
    mask[:, :, 16:] = 1.0
    for name in ("a", "b"):
        write_mp4(v / f"{name}.mp4", np.zeros((5, 32, 32, 3)), fps=8)
        (v / f"{name}.txt").write_text("x")
        write_mp4(v / f"{name}.mask.mp4", mask, fps=8)      # a: binary
        mask[2:, 8:24, 4:12] = 0.5                          # b: grey from frame 2
    rc = main(["preprocess", str(v), str(tmp_path / "out"), "--model", "demo", "--height", "32",
               "--width", "32", "--frames", "5", "--text-len", "8", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert "b.mask.mp4: frame 2 (from 0) is not binary (a value 0.5" in err[0], err[0]
    assert "a.mask.mp4" not in err[0] and not (tmp_path / "out").exists()
