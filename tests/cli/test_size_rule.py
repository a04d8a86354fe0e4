"""Each family's one size rule at every entry (issue 57 item 3): the VAE's factor times the
transformer's patch and the frame rule, declared once by the family
(:meth:`ditax.models.base.ModelFamily.size_rule`), checked by ``ditax preprocess`` (one
shape and buckets), ``train``, ``generate``, ``serve`` and ``plan`` before any work, with the
nearest valid values. The shipped Wan demo has a 4x VAE and a 4x4 patch: its sides are
multiples of 16, not the 8 of its VAE alone."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ditax.cli import main
from ditax.demo import flux_model_path, model_path
from ditax.models.base import family_class


def test_each_family_declares_its_rule():
    wan, demo = family_class("wan").size_rule(), family_class("wan").size_rule(model_path())
    assert (wan.spatial, wan.temporal, wan.latent) == (16, 4, (1, 2, 2))
    assert (demo.spatial, demo.temporal, demo.latent) == (16, 4, (1, 4, 4))
    assert "4x4 patch" in demo.why and "4x" in demo.why
    from ditax.config import load_config

    ti2v = load_config("wan2.2-ti2v-5b", []).model                # the 16x VAE
    assert family_class("wan").size_rule(model=ti2v).spatial == 32
    flux = family_class("flux").size_rule(flux_model_path())       # a 4x VAE, 2x2 packing
    assert (flux.spatial, flux.temporal) == (8, None)
    assert family_class("flux2").size_rule().spatial == 16
    ltx2 = family_class("ltx2").size_rule()
    assert (ltx2.spatial, ltx2.temporal) == (32, 8)
    assert demo.nearest_sides(72) == (64, 80) and wan.nearest_frames(18) == (17, 21)


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.fixture
def no_encoders(monkeypatch):
    import ditax.train.preprocess as pre

    def no_model(*a, **k):
        raise AssertionError("a model loaded")
    monkeypatch.setattr(pre, "_encoders", no_model)


@pytest.mark.parametrize("flags, words", [
    (["--width", "72"], "width=72 must be a positive multiple of 16 (the VAE's 4x and the "
                        "transformer's 4x4 patch) on this wan model; use 64 or 80"),
    (["--buckets", "72x64x17"], "the nearest valid bucket is 64x64x17"),
    (["--bucket-area", "1536", "--frames", "5"], None),
])
def test_preprocess_takes_the_demos_own_grid(flags, words, tmp_path, capsys, no_encoders):
    videos = tmp_path / "videos"
    videos.mkdir()
    rc = main(["preprocess", str(videos), str(tmp_path / "out"), "--model", "demo", *flags])
    assert rc == 2
    err = _one_line(capsys)
    if words is None:        # the derived buckets pass; only the empty folder is refused
        assert "no videos" in err, err
    else:
        assert words in err, err


def test_train_refuses_a_dataset_off_the_models_patch(tmp_path, capsys):
    from ditax.train.data_writer import DatasetWriter

    r = np.random.default_rng(0)
    w = DatasetWriter(tmp_path / "ds", samples_per_file=4)
    for _ in range(2):        # 8 x 9 latents: the tiny model's 2x2 patch cannot take 9
        w.add(r.standard_normal((16, 2, 8, 9)).astype(np.float32),
              r.standard_normal((16, 64)).astype(np.float32), np.ones(16, np.uint8))
    w.close()
    rc = main(["train", "tiny", f"data.source={tmp_path / 'ds'}",
               f"output_dir={tmp_path / 'run'}", "steps=1", "--no-progress"])
    assert rc == 2
    err = _one_line(capsys)
    assert "latents [16, 2, 8, 9] are off the wan model's grid" in err, err
    assert "multiples of (1, 2, 2)" in err and "multiples of 16 pixels" in err


@pytest.mark.parametrize("flags, words", [
    (["--width", "72"], "width=72 must be a positive multiple of 16 (the VAE's 4x and the "
                        "transformer's 4x4 patch) on this wan model; use 64 or 80"),
    (["--frames", "18"], "num_frames=18 must be of the form 4k+1"),
    (["--frames", "18"], "use 17 or 21"),
])
def test_generate_refuses_off_the_folders_rule(flags, words, tmp_path, capsys, monkeypatch):
    import ditax

    def no_load(*a, **k):
        raise AssertionError("a model loaded")
    monkeypatch.setattr(ditax, "load_pipeline", no_load)
    rc = main(["generate", "--model", "demo", "--prompt", "a cat", "--output",
               str(tmp_path / "o.mp4"), *flags])
    assert rc == 2 and words in _one_line(capsys)


def test_calibrate_cache_refuses_off_the_folders_rule(tmp_path, capsys, monkeypatch):
    import ditax

    def no_load(*a, **k):
        raise AssertionError("a model loaded")
    monkeypatch.setattr(ditax, "load_pipeline", no_load)
    rc = main(["calibrate-cache", "--model", "demo", "--width", "72", "--output",
               str(tmp_path / "n.json")])
    assert rc == 2 and "width=72 must be a positive multiple of 16" in _one_line(capsys)


def test_serve_refuses_with_the_same_words(tmp_path):
    from ditax.serve.requests import BadRequest, check_body

    with pytest.raises(BadRequest) as e:
        check_body({"prompt": "a cat", "size": "72x64"}, str(model_path()), [],
                   str(tmp_path / "r.mp4"))
    assert e.value.param == "size" and "use 64 or 80" in str(e.value)
    assert "4x4 patch" in str(e.value) and "--" not in str(e.value)
    with pytest.raises(BadRequest) as e:
        check_body({"prompt": "a cat", "num_frames": 18}, str(model_path()), [],
                   str(tmp_path / "r.mp4"))
    assert e.value.param == "num_frames" and "use 17 or 21" in str(e.value)


@pytest.mark.parametrize("flags, words", [
    (["sample.width=72"], "sample.width=72 must be a positive multiple of 16"),
    (["sample.num_frames=18"], "sample.num_frames=18 must be of the form 4k+1"),
    (["--latent", "5,8,9"], "use --latent 5,8,8"),
])
def test_plan_refuses_before_it_compiles(flags, words, capsys):
    assert main(["plan", "tiny", "--compile", "--devices", "1", *flags]) == 2
    assert words in _one_line(capsys)


def test_generate_help_shows_each_familys_frame_rule(capsys):
    assert main(["generate", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "wan: video frames, 4k+1" in text and "ltx2: video frames, 8k+1" in text


def test_the_demos_folder_defaults_are_on_its_rule():
    sample = json.loads((model_path() / "ditax_sample.json").read_text())
    rule = family_class("wan").size_rule(model_path())
    rule.check(sample["height"], sample["width"], sample["num_frames"])
