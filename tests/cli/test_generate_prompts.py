"""``ditax generate --prompts FILE``: one prompt a line or JSON lines of requests, every line
checked before the model loads (its line named), then one loaded pipeline; consecutive requests
of one shape run as one batch through the generic loop, each output equal to its request run
alone within float rounding."""

import json

import numpy as np
import pytest

from ditax.cli import main

pytestmark = pytest.mark.usefixtures("fast_compile")


def frames(path) -> np.ndarray:
    from ditax.io.video import read_video

    return np.asarray(read_video(path), np.float32)


def close(a, b) -> bool:
    """Two mp4s of (nearly) the same frames: H.264 turns a float difference of 1e-5 (a batch's
    wider matmuls) into a few flipped levels at most, so the mean stays far below one level
    (the rows' floats are compared in tests/pipelines/test_batch_families.py)."""
    return a.shape == b.shape and np.abs(a - b).mean() < 0.5


def test_prompts_batched_equal_one_by_one(tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("# the demo's words\na red circle moves right\n\n"
                       + json.dumps({"prompt": "a blue square moves up", "seed": 3}) + "\n"
                       + json.dumps({"prompt": "a green circle moves left",
                                     "num_inference_steps": 3}) + "\n")
    # small videos: what is tested is the batching of the file's lines, not the size
    small = ["--steps", "2", "--frames", "5"]
    base = ["generate", "--model", "demo", "--prompts", str(prompts), *small, "--no-progress"]
    assert main(base + ["--output", str(tmp_path / "b" / "x.mp4")]) == 0
    out = capsys.readouterr().out
    assert "wrote 3 outputs" in out and out.count("ran 2 requests as one batch") == 1, out
    assert main(base + ["--batch", "1", "--output", str(tmp_path / "one" / "x.mp4")]) == 0
    assert "as one batch" not in capsys.readouterr().out
    for i in range(3):
        a, b = frames(tmp_path / "b" / f"x_{i}.mp4"), frames(tmp_path / "one" / f"x_{i}.mp4")
        assert a.shape == (5, 64, 64, 3) and close(a, b), (i, np.abs(a - b).mean())
    # the JSON line's seed is its own; the plain line takes the flags' (0)
    assert main(["generate", "--model", "demo", "--prompt", "a blue square moves up", "--seed",
                 "3", *small, "--no-progress", "--output",
                 str(tmp_path / "alone.mp4")]) == 0
    assert close(frames(tmp_path / "alone.mp4"), frames(tmp_path / "b" / "x_1.mp4"))
    assert not close(frames(tmp_path / "b" / "x_0.mp4"), frames(tmp_path / "b" / "x_1.mp4"))


@pytest.mark.parametrize("text, extra, words", [
    ("a cat\n{not json\n", [], "line 2: not a JSON object"),
    ('a cat\n{"prompt": "a dog", "colour": "red"}\n', [], "line 2: unknown field 'colour'"),
    ('{"prompt": "a dog", "seed": true}\n', [], "line 1: seed=true must be"),
    ('{"prompt": "a dog", "num_frames": 6}\n', [], "line 1: num_frames=6 must be of the form"),
    ('{"prompt": "a dog", "true_cfg_scale": 2}\n', [], "it is for flux models"),
    ('{"prompt": "  "}\n', [], "line 1: prompt is empty"),
    ("# nothing\n\n", [], "has no prompt"),
    ("a cat\n", ["--prompt", "a dog"], "--prompt and --prompts"),
    ("a cat\n", ["--batch", "0"], "--batch 0 must be >= 1"),
])
def test_bad_prompt_files_are_refused_naming_the_line(tmp_path, capsys, text, extra, words):
    prompts = tmp_path / "p.txt"
    prompts.write_text(text)
    rc = main(["generate", "--model", "demo", "--prompts", str(prompts), "--output",
               str(tmp_path / "o.mp4"), "--no-progress", *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and words in err[0], err
    assert not list(tmp_path.glob("o*.mp4"))


def test_no_prompt_at_all(capsys):
    assert main(["generate", "--model", "demo"]) == 2
    assert "no prompt: give --prompt" in capsys.readouterr().err
