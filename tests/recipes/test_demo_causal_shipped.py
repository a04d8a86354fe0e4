"""The demo's shipped causal student (issue 59 item 4: ``ditax.demo.causal_model_path()``,
``--model demo-causal``): its folder is causal and points at the demo model's components, its
manifest matches, its recorded score holds the issue's bar, and the per-window scoring's
windows. Files only (no weights run: the sampling checks are in test_demo_causal.py, slow)."""

from __future__ import annotations

import json

import pytest

import ditax.demo
from ditax.demo.causal import long_frames, share, windows
from ditax.recipes.common import sha256

SHIPPED = ditax.demo.model_path().parent / ditax.demo.CAUSAL_DIR
needs_shipped = pytest.mark.skipif(not (SHIPPED / "transformer").is_dir(),
                                   reason="the demo's causal student is not shipped here")


@needs_shipped
def test_shipped_folder_is_causal_and_reuses_the_demo_models_parts():
    folder = ditax.demo.causal_model_path()
    config = json.loads((folder / "transformer" / "config.json").read_text())
    assert config["causal_chunk"] == 1
    sample = json.loads((folder / "ditax_sample.json").read_text())
    assert sample["num_inference_steps"] == 4 and sample["guidance_scale"] == 1.0
    assert sample["context_chunks"] == 3 and sample["num_frames"] == ditax.demo.SAMPLE[
        "num_frames"]
    for part in ("tokenizer", "text_encoder", "vae", "model_index.json"):     # linked
        assert (folder / part).is_symlink(), part
        assert (folder / part).resolve() == (ditax.demo.model_path() / part).resolve()
    listed = json.loads((folder / "manifest.json").read_text())["files"]
    assert set(listed) == {"ditax_sample.json", "score.json", "scheduler/scheduler_config.json",
                           "transformer/config.json",
                           "transformer/diffusion_pytorch_model.safetensors"}
    assert all(sha256(folder / name) == digest for name, digest in listed.items())


def test_model_demo_causal_resolves_to_the_shipped_folder():
    from ditax.front.folder import model_path

    if not (SHIPPED / "transformer").is_dir():
        with pytest.raises(Exception, match="make demo-causal"):
            model_path("demo-causal")
        return
    assert model_path("demo-causal") == str(ditax.demo.causal_model_path())


# Not met by the shipped student (measured by its recipe, 40 combinations x seed 1000, per
# window of 17 frames): teacher at 1x colour 97.5% / direction 97.5%; the student at 1x 87.5% /
# 97.5%; at 4x (77 frames) 83.0% / 35.0% (per window 97.5/67.5, 82.5/25.0, 80.0/17.5,
# 80.0/32.5, 75.0/32.5: the long-rollout stage, distill.rollout_chunks=20, keeps the colour;
# the direction past the first window, after the object leaves the frame as in every clip of
# the demo world's, still drifts). Before the long stage: 1x 80.0% / 95.0%, 4x 52.5% / 26.0%.
# Strict: a student that meets the bar turns this into a failure to be removed.
SHORT_OF_THE_BAR = pytest.mark.xfail(strict=True, reason="issue 59 item 4's bar is not met yet: "
                                     "the 4x video's windows 83.0% / 35.0% against the "
                                     "teacher's 97.5% / 97.5% (colour / direction)")


@needs_shipped
@SHORT_OF_THE_BAR
def test_shipped_score_the_long_video_holds_within_5_points_of_the_teacher():
    """The recipe's measurement (every combination x its seeds, per window of the teacher's 17
    frames): the student's 4x video against the teacher at 1x."""
    score = json.loads((SHIPPED / "score.json").read_text())
    assert score["causal_long"]["frames"] == 77 and score["teacher"]["frames"] == 17
    for k in ("colour", "direction"):
        assert score["causal_long"]["score"][k] >= score["teacher"]["score"][k] - 5, (k, score)


def test_windows_cover_the_video_at_the_teachers_length():
    assert windows(17, 17) == [(0, 17)]
    assert windows(77, 17) == [(0, 17), (17, 34), (34, 51), (51, 68), (60, 77)]
    assert windows(68, 17)[-1] == (51, 68)
    assert long_frames(17, 4, 4) == 77 and long_frames(17, 4, 1) == 17
    rows = [{"colour_correct": True, "shape_correct": False, "direction_correct": c}
            for c in (True, False, True, True)]
    assert share(rows) == {"colour": 100.0, "shape": 0.0, "direction": 75.0}
