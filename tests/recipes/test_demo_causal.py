"""The demo's causal student end to end (slow tier): the recipe that distils it (``make
demo-causal``) at toy sizes; the shipped student through ``ditax generate --model
demo-causal`` and ``pipe.stream``; its 4x-long videos scored per window against the teacher
at 1x (the issue's bar: colour and direction within 5 points)."""

from __future__ import annotations

import json

import imageio.v2 as imageio
import numpy as np
import pytest

import ditax
import ditax.demo
from ditax.recipes.demo_causal import SMOKE, Recipe

needs_shipped = pytest.mark.skipif(
    not (ditax.demo.model_path().parent / ditax.demo.CAUSAL_DIR / "transformer").is_dir(),
    reason="the demo's causal student is not shipped here")


@pytest.mark.usefixtures("fast_compile")
def test_smoke_recipe_distils_exports_and_scores_a_causal_folder(tmp_path):
    lines = []
    run = Recipe(tmp_path / "run", SMOKE, seed=0, train_devices=1, say=lines.append,
                 progress=False)
    rec = run.run()
    assert list(rec["stages"]) == list(Recipe.STAGES)
    # the long stage resumed the run with 4-chunk rollouts of the 2-latent-frame data
    assert rec["stages"]["long"]["steps"] == 1 and rec["stages"]["long"]["rollout_chunks"] == 4
    assert [p.name for p in (run.out / "distill" / "checkpoints").iterdir()] == ["2"]
    f = run.folder
    assert json.loads((f / "transformer" / "config.json").read_text())["causal_chunk"] == 1
    sample = json.loads((f / "ditax_sample.json").read_text())
    assert sample["context_chunks"] == SMOKE.context_chunks and sample["guidance_scale"] == 1
    assert (f / "vae").is_symlink() and not (f / "vae").readlink().is_absolute()
    score = json.loads((f / "score.json").read_text())
    assert score["causal_long"]["frames"] == 77 and score["causal"]["frames"] == 17
    assert score["causal_long"]["windows"] == 5 * score["causal"]["windows"]


@needs_shipped
def test_model_demo_causal_generates_and_streams(tmp_path, capsys):
    from ditax.cli import main

    frames = tmp_path / "frames"
    rc = main(["generate", "--model", "demo-causal", "--prompt", "a red circle moves right",
               "--height", "32", "--width", "32", "--frames", "9", "--no-progress",
               "--output", str(tmp_path / "out.mp4"), "--frames-dir", str(frames)])
    assert rc == 0, capsys.readouterr().err
    got = [imageio.imread(p) for p in sorted(frames.glob("frame_*.png"))]
    assert len(got) == 9 and got[0].shape == (32, 32, 3)
    pipe = ditax.load_pipeline(ditax.demo.causal_model_path())
    parts = list(pipe.stream("a red circle moves right", height=32, width=32, num_frames=13,
                             num_inference_steps=4, sigmas=[1.0, 0.75, 0.5, 0.25]))
    assert [len(p) for p in parts] == [1, 4, 4, 4] and np.isfinite(parts[-1]).all()


@needs_shipped
@pytest.mark.xfail(strict=True, reason="issue 59 item 4's bar is not met yet (measured: "
                   "tests/recipes/test_demo_causal_shipped.py's SHORT_OF_THE_BAR)")
def test_the_4x_video_holds_within_5_points_of_the_teacher_per_window():
    from ditax.demo.causal import score_causal
    from ditax.synthetic.vocab import all_combinations

    # every third combination (all colours, shapes and directions; 14 of 40), XLA optimised
    res = score_causal(ditax.demo.causal_model_path(), ditax.demo.model_path(),
                       [c.prompt for c in all_combinations()[::3]], (1000,),
                       say=lambda m: None)
    assert res["causal_long"]["frames"] == 77
    for k in ("colour", "direction"):
        assert res["causal_long"]["score"][k] >= res["teacher"]["score"][k] - 5, (k, {
            w: res[w]["score"] for w in ("teacher", "causal", "causal_long")})
