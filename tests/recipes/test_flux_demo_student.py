"""The small Flux's 4-step student (``make flux-demo-student``): the recipe end to end at toy
sizes on the shipped teacher, and the shipped LoRA (its manifest, its sampling settings, a
4-call image)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import ditax.demo
from ditax.recipes.common import check_manifest
from ditax.recipes.flux_demo_student import LORA_FILE, SAMPLE_FILE, SMOKE, STAGES, Recipe

pytestmark = pytest.mark.usefixtures("fast_compile")


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    out = tmp_path_factory.mktemp("flux_demo_student")
    lines = []
    # the student trains on one device (not about the mesh: the DMD2 step compiles faster)
    rec = Recipe(out, SMOKE, seed=0, train_devices=1, say=lines.append,
                 progress=False).run()
    return out, rec


def test_recipe_distils_scores_and_ships_a_student(recipe):
    from ditax.io.weights import Weights
    from ditax.lora.export import META_KEY

    out, rec = recipe
    assert list(rec["stages"]) == list(STAGES)
    # the LoRA carries the student's settings: 4 Euler steps on its sigmas, no true CFG
    meta = json.loads(Weights.open(out / "distill" / LORA_FILE).metadata()[META_KEY])
    assert meta == json.loads((out / "distill" / SAMPLE_FILE).read_text())
    assert meta["num_inference_steps"] == SMOKE.student_steps == len(meta["sigmas"])
    assert meta["true_cfg_scale"] == 1.0
    # the score sampled the teacher with its steps, the student with the LoRA's
    score = rec["stages"]["score"]
    teacher = json.loads((ditax.demo.flux_model_path() / SAMPLE_FILE).read_text())
    assert score["teacher"]["transformer_calls"] == teacher["num_inference_steps"]
    assert score["student"]["transformer_calls"] == SMOKE.student_steps
    n = len(SMOKE.score_seeds) * SMOKE.score_prompts
    assert sum(score["student"][k].get("images", 0) for k in ("seen", "held_out")) == n
    ship = out / "student"
    assert check_manifest(ship) == []
    assert (ship / LORA_FILE).read_bytes() == (out / "distill" / LORA_FILE).read_bytes()
    (ship / SAMPLE_FILE).write_text("{}")
    assert check_manifest(ship) == [SAMPLE_FILE]       # the check sees a changed file


def test_shipped_student_manifest_matches_and_lora_carries_its_settings():
    from ditax.io.weights import Weights
    from ditax.lora.export import META_KEY

    lora = ditax.demo.flux_student_lora_path()
    assert (lora.parent / "manifest.json").is_file()
    assert check_manifest(lora.parent) == []
    meta = json.loads(Weights.open(lora).metadata()[META_KEY])
    assert meta == json.loads((lora.parent / SAMPLE_FILE).read_text())
    assert {k: meta[k] for k in ("num_inference_steps", "sigmas", "guidance_scale")} == {
        k: ditax.demo.FLUX_STUDENT_SAMPLE[k] for k in ("num_inference_steps", "sigmas",
                                                        "guidance_scale")}


def test_shipped_student_samples_in_four_calls():
    from ditax.pipelines.flux.loading import load_pipeline

    sample = ditax.demo.FLUX_STUDENT_SAMPLE
    assert sample["num_inference_steps"] == 4
    pipe = load_pipeline(ditax.demo.flux_model_path(),
                         loras=[(ditax.demo.flux_student_lora_path(), 1.0)])
    image = pipe("a red circle on the left", seed=0, progress=False, **sample)
    assert pipe.last_stats["transformer_calls"] == 4
    assert image.shape == (sample["height"], sample["width"], 3)
    assert np.isfinite(image).all() and 0.0 <= image.min() and image.max() <= 1.0
