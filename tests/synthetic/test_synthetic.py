"""The synthetic "bright object moves" data (issue 12): vocabulary, clip generator, dataset
writer, prompt-following scorer and contact sheet. Fast (no JAX work)."""

import json

import numpy as np
import pytest

from ditax.errors import RequestError
from ditax.synthetic import clips, score, sheet, vocab


def test_vocabulary_is_the_fixed_one():
    assert vocab.COLOURS["blue"] == (0.15, 0.3, 0.95) and len(vocab.COLOURS) == 5
    assert len(vocab.all_combinations()) == 40
    assert len(vocab.seen_combinations()) == 35 and len(vocab.held_out_combinations()) == 5
    assert vocab.Combo("red", "square", "up") in vocab.HELD_OUT
    assert vocab.is_held_out(("white", "square", "left"))
    assert not vocab.is_held_out(("white", "square", "right"))
    assert not set(vocab.seen_combinations()) & set(vocab.HELD_OUT)


def test_prompt_round_trip_and_errors():
    for c in vocab.all_combinations():
        assert vocab.parse_prompt(c.prompt) == c
        assert vocab.canonical_prompt(*c) == c.prompt
    assert vocab.parse_prompt("  A Red  circle moves LEFT ") == ("red", "circle", "left")
    assert vocab.Combo("red", "circle", "left").prompt == "a red circle moves left"
    with pytest.raises(RequestError, match="purple"):
        vocab.parse_prompt("a purple circle moves left")
    with pytest.raises(RequestError, match="form"):
        vocab.parse_prompt(vocab.paraphrase(("red", "circle", "left"), 0))
    with pytest.raises(RequestError, match="direction"):
        vocab.canonical_prompt("red", "circle", "sideways")


def test_generator_is_deterministic():
    a, sa = clips.make_clip(3)
    b, sb = clips.make_clip(3)
    c, _ = clips.make_clip(4)
    assert a.dtype == np.float32 and a.shape == (17, 64, 64, 3)
    assert sa == sb and np.array_equal(a, b)
    assert not np.array_equal(a, c)
    one = [v for v, _ in clips.generate(5, seed=1, height=32, width=48, num_frames=9)]
    two = [v for v, _ in clips.generate(5, seed=1, height=32, width=48, num_frames=9)]
    other = [v for v, _ in clips.generate(5, seed=2, height=32, width=48, num_frames=9)]
    assert all(np.array_equal(x, y) for x, y in zip(one, two))
    assert not all(np.array_equal(x, y) for x, y in zip(one, other))


@pytest.mark.parametrize("height,width,num_frames", [(64, 64, 17), (48, 80, 9), (32, 32, 5)])
def test_clip_constraints(height, width, num_frames):
    for i, combo in enumerate(vocab.all_combinations()):
        video, spec = clips.make_clip((7, i), combo, height=height, width=width,
                                      num_frames=num_frames)
        assert video.shape == (num_frames, height, width, 3) and video.dtype == np.float32
        assert 0.0 <= video.min() and video.max() <= 1.0
        a = clips.coverage(spec, height, width, num_frames)
        bg, inside = video[a == 0], video[a == 1]
        assert bg.max() <= clips.BACKGROUND_MAX and np.all(bg == bg[0])      # one plain shade
        assert inside.size and np.all(inside == np.float32(combo.rgb))         # exact colour
        # fully inside the frame: the covered area is the shape's area in every frame
        area = spec.size ** 2 * (1.0 if combo.shape == "square" else np.pi / 4)
        np.testing.assert_allclose(a.sum((1, 2)), area, rtol=0.02)  # AA ramp
        # centroid travel along the direction's axis >= 25% of the frame, the right way
        yy, xx = np.mgrid[:height, :width]
        cy = (a * yy).sum((1, 2)) / a.sum((1, 2))
        cx = (a * xx).sum((1, 2)) / a.sum((1, 2))
        dy, dx = (cy[-1] - cy[0]) / height, (cx[-1] - cx[0]) / width
        step_y, step_x = vocab.DIRECTION_VECTORS[combo.direction]
        along, across = (dy * step_y, dx) if step_y else (dx * step_x, dy)
        assert along >= 0.25 and abs(across) < 0.01       # pixelised disc: ~1e-3 wobble
        c = spec.centres(num_frames)                       # the path itself: straight, even
        np.testing.assert_allclose(np.diff(c, axis=0), np.diff(c, axis=0)[:1].repeat(
            num_frames - 1, 0), atol=1e-9)


def test_held_out_never_generated_unless_asked():
    held = set(vocab.HELD_OUT)
    assert not held & set(clips.dataset_combos(700, seed=0))
    assert not held & {clips.make_clip(s, height=16, width=16, num_frames=2)[1].combo
                       for s in range(300)}
    assert set(clips.dataset_combos(40, seed=0, include_held_out=True)) == \
        set(vocab.all_combinations())
    assert set(clips.dataset_combos(35, seed=5)) == set(vocab.seen_combinations())


def test_write_dataset_is_found_by_preprocess(tmp_path):
    from ditax.train.preprocess import find_samples, read_video

    folder = clips.write_dataset(tmp_path / "d", n=6, seed=11, height=32, width=48,
                                 num_frames=9)
    rows = [json.loads(x) for x in (folder / "captions.jsonl").read_text().splitlines()]
    samples = find_samples(folder)
    assert [p.name for p, _ in samples] == [r["file"] for r in rows]
    clips_again = list(clips.generate(6, seed=11, height=32, width=48, num_frames=9))
    for (path, caption), row, (video, spec) in zip(samples, rows, clips_again):
        assert caption == spec.combo.prompt == row["prompt"]
        assert (row["colour"], row["shape"], row["direction"]) == spec.combo
        assert spec.combo not in vocab.HELD_OUT
        back = (read_video(path, 9, 32, 48).transpose(1, 2, 3, 0) + 1) / 2
        assert np.abs(back - video).max() <= 3 / 255          # lossless 4:4:4 H.264
    para = clips.write_dataset(tmp_path / "p", n=4, seed=11, height=32, width=48,
                               num_frames=5, paraphrase_fraction=1.0)
    caps = [c for _, c in find_samples(para)]
    assert all(c not in {x.prompt for x in vocab.all_combinations()} for c in caps)


@pytest.mark.parametrize("height,width,seeds", [(64, 64, 2), (48, 80, 1)])
def test_scorer_is_right_on_every_combination(height, width, seeds):
    for seed in range(seeds):
        for i, combo in enumerate(vocab.all_combinations()):
            video, _ = clips.make_clip((seed, i), combo, height=height, width=width)
            r = score.score(video, combo.prompt)
            assert r["all_correct"], (combo, r)
            assert abs(r["fill"] - (1.0 if combo.shape == "square" else np.pi / 4)) < 0.05
            for wrong in vocab.DIRECTIONS:      # the flags depend on the prompt
                assert (r["direction"] == wrong) == (wrong == combo.direction)


def test_scorer_after_mp4_round_trip(tmp_path):
    """All 40 combinations through the dataset's encoder, as one file (one ffmpeg each way)."""
    from ditax.io.video import read_video

    made = [clips.make_clip((3, i), c) for i, c in enumerate(vocab.all_combinations())]
    clips.write_clip(tmp_path / "all.mp4", np.concatenate([v for v, _ in made]))
    back = read_video(tmp_path / "all.mp4").reshape(40, 17, 64, 64, 3)
    for video, (_, spec) in zip(back, made):
        got = score.score(video, spec.combo.prompt)
        assert got["colour_correct"] and got["direction_correct"] and got["shape_correct"], got


def test_scorer_says_no_to_noise_and_nothing():
    rng = np.random.default_rng(0)
    videos = [rng.random((17, 64, 64, 3), dtype=np.float32),
              (rng.random((9, 32, 32, 3)) * 255).astype(np.uint8),
              np.clip(0.1 + 0.05 * rng.standard_normal((17, 64, 64, 3)), 0, 1),
              np.zeros((17, 64, 64, 3), np.float32), np.ones((5, 16, 16, 3)),
              np.full((3, 8, 8, 3), np.nan)]
    for v in videos:
        for c in vocab.all_combinations()[::9]:
            r = score.score(v, c.prompt)
            assert not (r["colour_correct"] or r["shape_correct"] or r["direction_correct"])
            assert r["found_frames"] == 0 and r["colour"] is None
    still, _ = clips.make_clip(0, ("red", "square", "left"))
    r = score.score(np.repeat(still[:1], 17, axis=0), "a red square moves left")
    assert r["colour_correct"] and r["shape_correct"] and r["direction"] is None
    with pytest.raises(ValueError, match="F, H, W, 3"):
        score.measure(np.zeros((4, 4, 3)))


def test_contact_sheet_png(tmp_path):
    from PIL import Image

    combos = vocab.all_combinations()[:3]
    videos = [clips.make_clip(i, c, height=32, width=48, num_frames=9)[0]
              for i, c in enumerate(combos)]
    path = sheet.contact_sheet(videos, [c.prompt for c in combos], tmp_path / "s.png",
                               frames=4, scale=2)
    with Image.open(path) as im:
        assert im.format == "PNG"
        assert im.size == sheet.sheet_size([v.shape for v in videos], 4, 2)
        p, lab = sheet.PAD, sheet.LABEL_HEIGHT
        assert im.size == (p + 4 * (48 * 2 + p), p + 3 * (lab + 32 * 2 + p))
    with pytest.raises(ValueError, match="one prompt per video"):
        sheet.contact_sheet(videos, ["x"], tmp_path / "t.png")
