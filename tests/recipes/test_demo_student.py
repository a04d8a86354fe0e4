"""The demo model's 4-step student: the recipe that distils it (``make demo-student``) at toy
sizes, end to end, and the shipped LoRA (``ditax.demo.student_lora_path()``) sampled as
``ditax.demo.STUDENT_SAMPLE`` says."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import ditax
import ditax.demo
from ditax.recipes.demo_student import (LORA_FILE, SAMPLE_FILE, SCORE_FILE, SMOKE, STAGES,
                                        Recipe, check_manifest)

# XLA with most optimisations off: the DMD2 step (rollout, teacher with guidance, critic
# updates) compiles ~3x faster; the shipped student's checks compare with its own reference
pytestmark = pytest.mark.usefixtures("fast_compile")


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo_student")
    lines = []
    # the student trains on one device (not about the mesh: the DMD2 step compiles ~3x faster)
    run = Recipe(out, SMOKE, seed=0, train_devices=1, say=lines.append, progress=False)
    return out, run.run(), run


def test_smoke_recipe_distils_scores_and_ships_a_lora(recipe):
    out, rec, run = recipe
    assert list(rec["stages"]) == list(STAGES)
    rows = [json.loads(x) for x in (out / "distill" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == SMOKE.steps
    for r in rows:     # the DMD loss, its critic's flow-matching loss
        assert math.isfinite(r["loss"]) and math.isfinite(r["critic_loss"]), r
    assert rec["stages"]["distill"]["last_critic_loss"] == rows[-1]["critic_loss"]
    # the student's sampling settings: what the LoRA file carries and what shipped beside it
    sample = json.loads((run.folder / SAMPLE_FILE).read_text())
    assert sample == {**sample, "num_inference_steps": SMOKE.student_steps,
                      "guidance_scale": 1.0, "scheduler": "euler", "flow_shift": SMOKE.shift}
    assert len(sample["sigmas"]) == SMOKE.student_steps
    from ditax.io.weights import Weights

    meta = json.loads(Weights.open(run.folder / LORA_FILE).metadata()["ditax_sample"])
    assert meta == sample
    # the score: every scored video of both, the student's with one transformer call a step,
    # the teacher's with two (classifier-free guidance)
    score = json.loads((out / SCORE_FILE).read_text())
    n = SMOKE.score_combos * len(SMOKE.score_seeds)
    assert len(score["teacher"]["rows"]) == len(score["student"]["rows"]) == n
    assert {r["transformer_calls"] for r in score["student"]["rows"]} == {SMOKE.student_steps}
    assert {r["transformer_calls"] for r in score["teacher"]["rows"]} == {2 * SMOKE.teacher_steps}
    assert set(score["student"]["summary"]) == {"seen", "held_out", "median_seconds_per_video",
                                                "median_seconds"}
    # the shipped folder: its manifest holds every file, and notices a changed byte
    assert check_manifest(run.folder) == []
    listed = json.loads((run.folder / "manifest.json").read_text())["files"]
    assert set(listed) == {LORA_FILE, SAMPLE_FILE, SCORE_FILE}
    f = run.folder / SCORE_FILE
    f.write_text(f.read_text() + " ")
    assert check_manifest(run.folder) == [SCORE_FILE]


def test_smoke_student_loads_and_samples_other_than_its_teacher(recipe):
    from ditax.demo import load_student, model_path

    out, _, run = recipe
    kw = dict(height=SMOKE.height, width=SMOKE.width, num_frames=SMOKE.frames, seed=3,
              progress=False, num_inference_steps=SMOKE.student_steps, guidance_scale=1.0)
    student = load_student(lora=run.folder / LORA_FILE)
    video = student("a red circle moves right", **kw)
    assert video.shape == (SMOKE.frames, SMOKE.height, SMOKE.width, 3)
    assert np.isfinite(video).all()
    assert student.last_stats["transformer_calls"] == SMOKE.student_steps
    # the LoRA trained: without it (same sampler) the video differs
    base = ditax.load_pipeline(model_path(), scheduler="euler", flow_shift=SMOKE.shift)
    plain = base("a red circle moves right", **kw)
    assert np.abs(video - plain).max() > 1e-4


needs_shipped = pytest.mark.skipif(
    not (ditax.demo.model_path().parent / "demo_student" / LORA_FILE).is_file(),
    reason="the demo student is not shipped in this checkout")


@needs_shipped
def test_shipped_student_manifest_matches_its_files():
    folder = ditax.demo.student_lora_path().parent
    assert check_manifest(folder) == []
    listed = json.loads((folder / "manifest.json").read_text())["files"]
    assert LORA_FILE in listed and SAMPLE_FILE in listed


@needs_shipped
def test_shipped_student_samples_in_four_calls_as_documented():
    """The documented call: the LoRA's own settings pick the sampler (Euler at the shift of
    STUDENT_LOAD), STUDENT_SAMPLE the rest; 4 transformer calls (no guidance), a finite video
    of the demo's size that follows its prompt."""
    from ditax.schedulers.flow_match import FlowMatchEulerScheduler
    from ditax.synthetic.score import score

    sample, load = ditax.demo.STUDENT_SAMPLE, ditax.demo.STUDENT_LOAD
    assert sample["num_inference_steps"] == 4 and sample["guidance_scale"] == 1.0
    assert load["scheduler"] == "euler"
    pipe = ditax.load_pipeline(ditax.demo.model_path(),
                               loras=[(ditax.demo.student_lora_path(), 1.0)])
    assert isinstance(pipe.scheduler, FlowMatchEulerScheduler)
    assert pipe.scheduler.shift == load["flow_shift"]
    prompt = "a blue square moves up"
    video = pipe(prompt, seed=0, progress=False, **sample)
    demo = ditax.demo.SAMPLE
    assert video.shape == (demo["num_frames"], demo["height"], demo["width"], 3)
    assert np.isfinite(video).all()
    assert pipe.last_stats["transformer_calls"] == 4
    s = score(video, prompt)
    assert s["colour_correct"] and s["direction_correct"], s
