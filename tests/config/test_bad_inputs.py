"""Bad inputs a user hands ditax end in one line naming the file or value, exit 2, before the
work (issue 23, classes 4-6 for config, data and preprocess): unreadable YAML / JSON /
captions name the file and the line; non-finite floats and out-of-range ints of any config
key are refused; a file where a folder is expected, a missing dataset, a bad ``--lora``
strength and preprocess sizes are bad requests (2), not failures (1); ``ditax preprocess``
checks its output before loading anything and never leaves a half-written dataset."""

import numpy as np
import pytest

from ditax.cli import main
from ditax.config import ConfigError, load_config

BAD_UTF8 = b"optim:\n  learning_rate: 1e-4\n  # caf\xe9\n"


def run_cli(capsys, *argv):
    """``main(argv)`` → (exit code, the stderr lines)."""
    rc = main([str(a) for a in argv])
    err = capsys.readouterr().err.splitlines()
    return rc, [ln for ln in err if ln.strip() and not ln.startswith("ditax: ")]  # no status


def one_line(err, prog, *words):
    assert len(err) == 1, err
    assert err[0].startswith(f"ditax {prog}: error: "), err
    for w in words:
        assert w in err[0], err


# ---------------------------------------------------------------------------------------------
# config files and values


@pytest.mark.parametrize("content, words", [
    (b"model: {num_layers: 2\n  bad: [\n", ["line 2", "not valid YAML"]),
    (BAD_UTF8, ["line 3, column 8", "not UTF-8"]),
    (b"- a\n- b\n", ["expected a mapping", "list"]),
    (b"3\n", ["expected a mapping", "int"]),
])
def test_unreadable_yaml_config_names_file_and_line(tmp_path, capsys, content, words):
    cfg = tmp_path / "run.yaml"
    cfg.write_bytes(content)
    rc, err = run_cli(capsys, "train", cfg, "steps=0", f"output_dir={tmp_path / 'out'}")
    assert rc == 2
    one_line(err, "train", "run.yaml", *words)
    assert not (tmp_path / "out").exists()


def test_base_cycle_and_folder_config_are_config_errors(tmp_path, capsys):
    cyc = tmp_path / "cyc.yaml"
    cyc.write_text(f"base: {cyc}\n")
    rc, err = run_cli(capsys, "train", cyc, "steps=0")
    assert rc == 2
    one_line(err, "train", "cyc.yaml", "base: chain comes back to itself")
    folder = tmp_path / "dir.yaml"
    folder.mkdir()
    rc, err = run_cli(capsys, "train", folder, "steps=0")
    assert rc == 2
    one_line(err, "train", "dir.yaml", "is a folder")


@pytest.mark.parametrize("override", [
    "optim.learning_rate=nan", "optim.learning_rate=inf", "optim.learning_rate=-inf",
    "optim.weight_decay=nan", "optim.grad_clip=nan", "flow.shift=inf", "flow.logit_std=nan",
    "flow.logit_mean=inf", "lora.alpha=nan", "model.eps=nan", "sample.guidance_scale=inf",
])
def test_every_non_finite_float_key_is_refused(override):
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=rf"{key}=.*finite"):
        load_config("tiny", [override])


def test_non_finite_float_in_yaml_and_vae_config_exit_2(tmp_path, capsys):
    cfg = tmp_path / "nan.yaml"
    cfg.write_text("optim:\n  learning_rate: .nan\n")
    rc, err = run_cli(capsys, "train", cfg, "steps=0", f"output_dir={tmp_path / 'o'}")
    assert rc == 2
    one_line(err, "train", "optim.learning_rate=nan", "finite")
    rc, err = run_cli(capsys, "train-vae", "loss.kl=inf", f"data.source={tmp_path}",
                      f"output_dir={tmp_path / 'v'}")
    assert rc == 2
    one_line(err, "train-vae", "loss.kl=inf", "finite")


@pytest.mark.parametrize("override, words", [
    ("steps=" + "1" * 32, ["steps=", "2**31"]),
    ("data.height=" + "8" * 32, ["data.height=", "2**31"]),
    ("batch_size=" + "1" * 27, ["batch_size=", "2**31"]),
    ("seed=" + "1" * 27, ["seed=", "2**32"]),
    ("seed=-1", ["seed=-1", "2**32"]),
    ("log_every=0", ["log_every=0", ">= 1"]),
    ("flow.logit_std=0", ["flow.logit_std=0", "> 0"]),
])
def test_out_of_range_values_are_refused_before_training(tmp_path, capsys, override, words):
    rc, err = run_cli(capsys, "train", "tiny", "steps=1", override,
                      f"output_dir={tmp_path / 'o'}", "--no-progress")
    assert rc == 2
    one_line(err, "train", *words)
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------------------------------------
# datasets


def test_bad_data_source_is_a_config_error(tmp_path, capsys):
    afile = tmp_path / "latents.bin"
    afile.write_text("x")
    bad = tmp_path / "bad_ds"
    bad.mkdir()
    (bad / "meta.json").write_text('{"format": "ditax-latents",\n  "version": 1,,\n}')
    cases = [(afile, ["is a file, not a dataset folder"]),
             (tmp_path / "missing", ["does not exist"]),
             (bad, ["meta.json: line 2", "not valid JSON"])]
    for source, words in cases:
        rc, err = run_cli(capsys, "train", "tiny", f"data.source={source}", "steps=1",
                          f"output_dir={tmp_path / 'o'}", "--no-progress")
        assert rc == 2, (source, err)
        one_line(err, "train", str(source), *words)


# ---------------------------------------------------------------------------------------------
# model files


def test_damaged_model_json_names_file_and_line(tmp_path):
    import ditax
    from ditax.io.files import UnreadableFile

    folder = tmp_path / "transformer"
    folder.mkdir()
    (folder / "config.json").write_text('{"_class_name": "WanTransformer3DModel",\n'
                                        '  "num_layers": 2\n  "x": 1}')
    (folder / "diffusion_pytorch_model.safetensors").write_bytes(b"")
    with pytest.raises(UnreadableFile, match=r"config\.json: line 3, column 3: transformer "
                                             r"config is not valid JSON.*re-download"):
        ditax.load_transformer(folder)


def _pipeline_without_weights(folder):
    """A Wan pipeline folder that is one (``model_index.json``) but holds nothing else: the
    folder passes the first check (issue 40: the model folder is checked before any request
    rule), a request reaching its preflight would be told what it lacks."""
    folder.mkdir()
    (folder / "model_index.json").write_text('{"_class_name": "WanPipeline"}')
    return folder


def test_bad_lora_strength_is_a_bad_request(tmp_path, capsys):
    _pipeline_without_weights(tmp_path / "none")
    lora = tmp_path / "style.safetensors"
    lora.write_bytes(b"")
    for spec, words in [(f"{lora}:abc", ["strength 'abc' is not a number"]),
                        (f"{lora}:nan", ["strength nan is not a finite number"]),
                        ("x.safetensors:inf", ["strength inf is not a finite number"])]:
        rc, err = run_cli(capsys, "generate", "--model", tmp_path / "none", "--prompt", "a cat",
                          "--lora", spec, "--output", tmp_path / "o.mp4", "--no-progress")
        assert rc == 2, (spec, err)
        one_line(err, "generate", "--lora", *words)


def test_huge_generate_size_is_a_bad_request(tmp_path, capsys):
    _pipeline_without_weights(tmp_path / "none")
    rc, err = run_cli(capsys, "generate", "--model", tmp_path / "none", "--prompt", "a cat",
                      "--height", 16 * 10**30, "--output", tmp_path / "o.mp4", "--no-progress")
    assert rc == 2
    one_line(err, "generate", "--height 16", "below 2**31")


# ---------------------------------------------------------------------------------------------
# ditax preprocess


def _clip(path, frames=5, size=32):
    from ditax.io.video import write_mp4

    write_mp4(path, np.random.default_rng(0).uniform(0, 1, (frames, size, size, 3)), fps=8)


@pytest.fixture
def videos(tmp_path):
    v = tmp_path / "videos"
    v.mkdir()
    _clip(v / "a.mp4")
    (v / "a.txt").write_text("a cat")
    return v


SMALL = ["--height", "32", "--width", "32", "--frames", "5", "--text-len", "8"]


@pytest.mark.parametrize("flags, words", [
    (["--height", str(10**30)], ["--height=", "2147483647"]),
    (["--width", "0"], ["--width=0"]),
    (["--frames", "6"], ["--frames / --height / --width = 6", "4k+1"]),
    (["--text-len", "-3"], ["--text-len=-3"]),
    (["--dtype", "int8"], ["--dtype='int8'", "float32"]),
    (["--batch", "0"], ["--batch=0"]),
])
def test_preprocess_sizes_are_bad_requests(tmp_path, capsys, videos, flags, words):
    rc, err = run_cli(capsys, "preprocess", videos, tmp_path / "ds", "--model", tmp_path / "m",
                      *SMALL, *flags)
    assert rc == 2
    one_line(err, "preprocess", *words)
    assert not (tmp_path / "ds").exists()


def test_preprocess_output_is_checked_first(tmp_path, capsys, videos):
    afile = tmp_path / "afile"
    afile.write_text("x")
    dataset = tmp_path / "old_ds"
    dataset.mkdir()
    (dataset / "meta.json").write_text("{}")
    full = tmp_path / "full"
    full.mkdir()
    (full / "notes.txt").write_text("keep me")
    for out, words in [(afile, ["is a file"]), (afile / "ds", ["afile is a file"]),
                       (dataset, ["already holds a dataset"]), (full, ["not empty"])]:
        rc, err = run_cli(capsys, "preprocess", videos, out, "--model", tmp_path / "m", *SMALL)
        assert rc == 2, (out, err)
        one_line(err, "preprocess", str(out), *words)
    assert (full / "notes.txt").read_text() == "keep me"


def test_preprocess_file_for_a_folder(tmp_path, capsys, videos):
    rc, err = run_cli(capsys, "preprocess", videos / "a.mp4", tmp_path / "ds", "--model",
                      "org/no-model", *SMALL)
    assert rc == 2
    one_line(err, "preprocess", "a.mp4", "is a file")
    rc, err = run_cli(capsys, "preprocess", videos, tmp_path / "ds", "--model", videos / "a.mp4",
                      *SMALL)
    assert rc == 2
    one_line(err, "preprocess", "--model", "is a file")


@pytest.mark.parametrize("name, content, words", [
    ("captions.jsonl", b'{"file": "a.mp4", "caption": "x"}\n{"file": oops}\n',
     ["captions.jsonl: line 2, column 10", "not valid JSON"]),
    ("captions.jsonl", b'{"file": "a.mp4"}\n', ["captions.jsonl: line 1", '"caption"']),
    ("captions.jsonl", b'{"file": "a.mp4", "caption": "caf\xe9"}\n',
     ["captions.jsonl: line 1, column 34", "not UTF-8"]),
    ("a.txt", b"line one\nbad \xff byte\n", ["a.txt: line 2, column 5", "not UTF-8"]),
])
def test_preprocess_unreadable_captions_name_file_and_line(tmp_path, capsys, videos, name,
                                                           content, words):
    (videos / "a.txt").unlink()
    (videos / name).write_bytes(content)
    rc, err = run_cli(capsys, "preprocess", videos, tmp_path / "ds", "--model", "org/no-model",
                      *SMALL)
    assert rc == 2
    one_line(err, "preprocess", *words)


def test_preprocess_empty_video_named_before_loading(tmp_path, capsys, videos):
    (videos / "b.mp4").write_bytes(b"")
    (videos / "b.txt").write_text("a dog")
    rc, err = run_cli(capsys, "preprocess", videos, tmp_path / "ds", "--model", "org/no-model",
                      *SMALL)
    assert rc == 2
    one_line(err, "preprocess", "b.mp4", "empty (0 bytes)")
    assert "ffmpeg version" not in err[0]


def test_read_video_names_the_clip(tmp_path):
    from ditax.io.files import VideoReadError
    from ditax.io.video import read_video

    bad = tmp_path / "notes.mp4"
    bad.write_text("not a video")
    with pytest.raises(VideoReadError, match=r"notes\.mp4: cannot be read as a video") as e:
        read_video(bad)
    assert "ffmpeg version" not in str(e.value) and "configuration:" not in str(e.value)
    (tmp_path / "empty.mp4").write_bytes(b"")
    with pytest.raises(VideoReadError, match=r"empty\.mp4: video file is empty"):
        read_video(tmp_path / "empty.mp4")


def test_failed_preprocess_leaves_no_dataset(tmp_path, capsys, videos):
    """A clip that fails while the encoders run: exit 2 naming it, and neither OUT nor a
    temporary folder is left (the successful run, renamed into place, is test_train_e2e's)."""
    from ditax.demo import model_path

    model = model_path()                 # the shipped demo pipeline: small, nothing to build
    # a readable header (the pre-pass probes sizes) but too few frames: found while decoding
    _clip(videos / "b.mp4", frames=3)
    (videos / "b.txt").write_text("a dog")
    out = tmp_path / "data" / "ds"
    rc, err = run_cli(capsys, "preprocess", videos, out, "--model", model, *SMALL)
    assert rc == 2
    one_line(err, "preprocess", "b.mp4", "has 3 frames, fewer than --frames=5")
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["videos"]  # no partial folder
