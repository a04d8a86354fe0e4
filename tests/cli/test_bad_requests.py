"""Issue 23, the follow-up sweep: further cases of its classes, tried as a new user would,
each fixed at its root. Real files and the CLI through ``ditax.cli.main`` (exit code and the
one ``ditax CMD: error: ...`` line), the library through its public calls:

- an empty or non-path path (``--model ""``, ``--lora ""``, ``--lora :0.5``, ``output_dir=``,
  ``data.source=``, ``load_pipeline(None)``) is refused naming it, instead of meaning the current folder
  (:func:`ditax.io.files.path_arg`);
- what the model folder can tell is checked before any weights load: ``--guidance-2`` on a
  one-expert folder, a size whose latent grid exceeds the RoPE table (``check_grid``);
- outputs are checked before the work for ``convert --out`` and ``plan --dump-hlo`` too;
- every file read names itself (a step-cache numbers file with bad UTF-8);
- bad values exit 2 in one line, not 1 with an exception name (``train-vae --devices``),
  and ``ditax config`` never lists a config that would be refused;
- the library refuses wrong argument types and unknown keywords with a ``DitaxError``
  (overrides given as a string, ``mesh="x"``, ``max_sequence_length=0``, unknown model keys);
- ``--model demo`` means the shipped demo model for ``preprocess`` as for ``generate``.
"""

from __future__ import annotations

import pathlib

import pytest

import ditax
from ditax.cli import main
from ditax.errors import ConfigError, DitaxError

DEMO = pathlib.Path(ditax.__file__).parent / "assets" / "demo_model"
pytestmark = pytest.mark.skipif(not (DEMO / "model_index.json").is_file(),
                                reason="the demo model is not in this checkout")


def _fails(capsys, argv, code=2) -> str:
    """Run ``ditax ARGV``; it exits ``code`` with one error line and no status line before
    it (nothing loaded); returns that line."""
    rc = main([str(a) for a in argv])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert rc == code, err
    assert len(err) == 1 and err[0].startswith(f"ditax {argv[0]}: error: "), err
    for raw in ("Error:", "Traceback", "NotADirectory", "IsADirectory", "UnicodeDecode"):
        assert raw not in err[0], err[0]
    return err[0]


@pytest.fixture
def here(tmp_path, monkeypatch):
    """The current folder holds a safetensors file, so '' read as '.' would find it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "other.safetensors").write_bytes(b"not weights")
    return tmp_path


@pytest.mark.parametrize("argv, says", [
    (["generate", "--model", "", "--prompt", "cat"], "model path is empty"),
    (["generate", "--model", "demo", "--prompt", "cat", "--lora", ""], "--lora '' names no file"),
    (["generate", "--model", "demo", "--prompt", "cat", "--lora", ":0.5"],
     "names no file before the strength"),
    (["generate", "--model", "demo", "--prompt", "cat", "--output", ""], "--output is empty"),
    (["train", "tiny", "output_dir="], "output_dir is empty"),
    (["train", "tiny", "data.source=", "output_dir=run"], "data.source is empty"),
])
def test_empty_paths_are_named_not_the_current_folder(capsys, here, argv, says):
    line = _fails(capsys, argv)
    assert says in line and "other.safetensors" not in line and "non-empty folder" not in line


def test_library_paths_that_are_no_path(here):
    for bad in ("", None, 123):
        with pytest.raises(DitaxError, match="model path"):
            ditax.load_pipeline(bad)
    with pytest.raises(DitaxError, match="model path is empty"):
        ditax.load_transformer("")
    with pytest.raises(DitaxError, match="weights path is empty"):
        ditax.load_transformer(DEMO, loras=[""])


def test_folder_facts_are_checked_before_loading(capsys):
    line = _fails(capsys, ["generate", "--model", "demo", "--prompt", "cat", "--guidance-2", 3])
    assert "--guidance-2" in line and "one-expert" in line
    line = _fails(capsys, ["generate", "--model", "demo", "--prompt", "cat", "--width", 100000])
    assert "rope_max_seq_len=1024" in line and "--width 16384 or less" in line
    line = _fails(capsys, ["generate", "--model", "demo", "--prompt", "cat", "--frames", 4097])
    assert "--frames 4093 or less" in line


def test_pipeline_call_checks_the_rope_grid():
    pipe = ditax.load_pipeline(DEMO)
    with pytest.raises(DitaxError, match="--width 16384 or less"):
        pipe("cat", width=16400, height=16, num_frames=1, num_inference_steps=1)


def test_convert_out_and_plan_dump_hlo_checked_first(capsys, tmp_path):
    single = tmp_path / "one.safetensors"
    single.write_bytes((DEMO / "transformer" / "diffusion_pytorch_model.safetensors")
                       .read_bytes())
    (tmp_path / "afile").write_text("x")
    for out in ("/proc/ditax-sweep/out", tmp_path / "afile" / "out"):
        line = _fails(capsys, ["convert", single, "--config", "tiny", "--out", out])
        assert "--out" in line and ("not writable" in line or "is a file" in line)
    line = _fails(capsys, ["plan", "tiny", "--dump-hlo", tmp_path, "--compile"])
    assert "--dump-hlo" in line and "existing folder" in line and "out.mp4" not in line
    line = _fails(capsys, ["plan", "tiny", "--dump-hlo", "/proc/ditax-sweep/f.txt"])
    assert "not writable" in line


def test_numbers_file_with_bad_utf8_is_named(capsys, tmp_path):
    bad = tmp_path / "numbers.json"
    bad.write_bytes(b"\xff\xfe{}")
    line = _fails(capsys, ["generate", "--model", "demo", "--prompt", "cat",
                           f"sample.cache_coefficients={bad}"])
    assert str(bad) in line and "not UTF-8" in line
    line = _fails(capsys, ["calibrate-cache", "--model", "demo", "--into", bad])
    assert str(bad) in line and "not UTF-8" in line


def test_train_vae_devices_that_do_not_split_the_batch(capsys, tmp_path):
    line = _fails(capsys, ["train-vae", "--devices", 3, f"data.source={tmp_path}",
                           f"output_dir={tmp_path / 'run'}"])
    assert "batch_size=4 does not split over 3" in line and "--devices 1 / 2 / 4" in line
    assert not (tmp_path / "run").exists()


def test_config_listing_validates(capsys):
    line = _fails(capsys, ["config", "tiny", "model.num_layers=-1"])
    assert "model.num_layers=-1 must be >= 1" in line
    assert main(["config", "--vae", "steps=5"]) == 0       # no data.source needed to list
    assert "steps = 5" in capsys.readouterr().out
    line = _fails(capsys, ["config", "--vae", "steps=-1"])
    assert "steps=-1" in line


def test_library_wrong_types_and_unknown_keywords():
    for bad in ("steps=3", {"steps": 3}, [3]):
        with pytest.raises(ConfigError, match="key=value"):
            ditax.load_config(None, bad)
    with pytest.raises(ConfigError, match="did you mean 'num_layers'"):
        ditax.load_transformer(DEMO, num_layer=3)
    with pytest.raises(ConfigError, match="not a jax.sharding.Mesh"):
        ditax.load_pipeline(DEMO, mesh="x")
    with pytest.raises(ConfigError, match="max_sequence_length=0"):
        ditax.load_pipeline(DEMO, max_sequence_length=0)


def test_preprocess_takes_model_demo(capsys, tmp_path):
    (tmp_path / "videos").mkdir()
    line = _fails(capsys, ["preprocess", tmp_path / "videos", tmp_path / "out", "--model", "demo",
                           "--height", 64, "--width", 64, "--frames", 17])
    assert "no videos" in line and "--model" not in line


def test_attend_refuses_bad_inputs_as_ditax_errors():
    import jax.numpy as jnp

    from ditax.attention import attend

    q = jnp.zeros((1, 8, 2, 16))
    with pytest.raises(DitaxError, match="rank 4"):
        attend(q[0], q[0], q[0])
    with pytest.raises(DitaxError, match="must agree on batch"):
        attend(q, q[..., :8], q[..., :8])
    with pytest.raises(DitaxError, match="scale must be a positive finite"):
        attend(q, q, q, scale=float("nan"))
    with pytest.raises(ConfigError, match="unknown attention backend 'nope'"):
        attend(q, q, q, backend="nope")
    with pytest.raises(TypeError, match="does not take option"):     # still a TypeError
        attend(q, q, q, bogus=1)
    with pytest.raises(ConfigError, match="does not take option"):
        attend(q, q, q, bogus=1)
