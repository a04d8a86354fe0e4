"""The front door's promise: a third family, written only in tests/refs/toy_third.py (its
config, folder classes, its own request field ``toy_sharpness``, a second output ``aux``),
runs through every entry with no change to ditax — ``ditax.load_pipeline`` and the generic
loop (CFG, step caching, compile cache), ``ditax generate`` (its flag in ``--help``, checked,
its second output written beside the video) and ``ditax train``; ``ditax serve`` is in
tests/serve/test_serve_third_family.py."""

import importlib
import json

import numpy as np
import pytest

import ditax
from compiles import compiles
from family_scope import families_restored

pytestmark = pytest.mark.usefixtures("fast_compile")


@pytest.fixture(scope="module")
def toy():
    """The toy family registered (as a plug-in module is on import) for this module only."""
    with families_restored():
        import toy_third

        yield importlib.reload(toy_third)       # registers again after another module's scope


@pytest.fixture(scope="module")
def folder(toy, tmp_path_factory):
    return toy.write_folder(tmp_path_factory.mktemp("toy_third") / "pipe")


def test_load_pipeline_and_the_generic_loop(toy, folder, tmp_path):
    pipe = ditax.load_pipeline(folder)
    assert isinstance(pipe, toy.ToyThirdVideo)
    out = pipe("a red fox", seed=1, toy_sharpness=2.0, progress=False)
    assert out["video"].shape == (1, 16, 16, 3) and out["aux"].shape == (1, 4)
    assert pipe.last_stats["transformer_calls"] == 2 * 3          # CFG: two branches, 3 steps
    # its own field reaches its decode: another sharpness, another video, same latents
    soft = pipe("a red fox", seed=1, toy_sharpness=0.5, progress=False)
    np.testing.assert_array_equal(soft["aux"], out["aux"])
    assert np.abs(soft["video"] - out["video"]).max() > 1e-3
    # step caching: a threshold nothing reaches skips every step after the first
    pipe("a red fox", seed=1, cache="first_block", cache_threshold=1e9, progress=False)
    assert pipe.last_stats["transformer_calls"] == 2 < 6
    # a second call of the same shape compiles nothing; the compile cache is written
    with compiles() as log:
        pipe("a blue boat", seed=2, toy_sharpness=2.0, progress=False)
    assert log.names == []
    pipe.compile_cache = str(tmp_path / "cache")
    pipe.programs.__init__()
    pipe("a blue boat", seed=2, num_inference_steps=2, progress=False)
    assert any((tmp_path / "cache").rglob("*")), "nothing written to the compile cache"


def test_generate_shows_checks_and_writes_both_outputs(toy, folder, tmp_path, capsys):
    from ditax.cli import main

    assert main(["generate", "--help"]) == 0
    shown = " ".join(capsys.readouterr().out.split())        # argparse wraps the lines
    assert "--toy-sharpness" in shown and "[toythird models]" in shown
    out = tmp_path / "fox.mp4"
    rc = main(["generate", "--model", str(folder), "--prompt", "a red fox", "--seed", "1",
               "--toy-sharpness", "2", "--output", str(out), "--no-progress"])
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    assert out.is_file() and (tmp_path / "fox.aux.npy").is_file(), printed.out
    want = ditax.load_pipeline(folder)("a red fox", seed=1, toy_sharpness=2.0, progress=False)
    np.testing.assert_array_equal(np.load(tmp_path / "fox.aux.npy"), want["aux"])
    for flags, words in ((["--toy-sharpness", "11"], "--toy-sharpness 11.0 must be in "
                                                     "[0.0, 10.0]"),
                         (["--toy-sharpness", "nan"], "--toy-sharpness nan must be a finite"),
                         (["--height", "18"], "height=18 must be a multiple of 4"),
                         (["--true-cfg", "3"], "--true-cfg is not taken by toythird models"),
                         (["--no-audio"], "which makes no sound track; drop --no-audio")):
        rc = main(["generate", "--model", str(folder), "--prompt", "x", "--output",
                   str(tmp_path / "bad.mp4"), "--no-progress", *flags])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and words in err[0], (flags, err)
    # the toy's flag on another family's folder names the family it belongs to
    rc = main(["generate", "--model", "demo", "--prompt", "x", "--toy-sharpness", "1",
               "--output", str(tmp_path / "w.mp4"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "it is for toythird models" in err, err
    assert not (tmp_path / "bad.mp4").exists() and not (tmp_path / "w.mp4").exists()


def test_the_family_trains_through_ditax_train(toy, tmp_path, capsys):
    import dataclasses

    import yaml

    from ditax.cli import main
    from ditax.train.data_writer import DatasetWriter

    r = np.random.default_rng(0)
    w = DatasetWriter(tmp_path / "latents", samples_per_file=8)
    for _ in range(8):
        w.add(r.standard_normal((4, 1, 4, 4)).astype(np.float32),
              r.standard_normal((toy.TEXT_LEN, 8)).astype(np.float32),
              np.ones(toy.TEXT_LEN, np.uint8))
    cfg = {"model": dataclasses.asdict(toy.ToyThirdConfig()),
           "mesh": {"data": 1, "fsdp": -1, "context": 1, "tensor": 1},
           "optim": {"learning_rate": 1.0e-2, "warmup_steps": 1},
           "data": {"source": str(w.close()), "text_len": toy.TEXT_LEN},
           "steps": 12, "batch_size": 8, "output_dir": str(tmp_path / "run")}
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["train", str(path), "--no-progress"]) == 0, capsys.readouterr().err
    losses = [json.loads(line)["loss"] for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert len(losses) == 12 and np.mean(losses[-3:]) < np.mean(losses[:3]), losses
