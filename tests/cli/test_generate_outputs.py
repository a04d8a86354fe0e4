"""Issue 23, the generation side: outputs checked first and written whole (class 4), nothing
silent (class 6: long prompts, seeds, calibrate-cache's prompt count), a folder's own sampling
defaults (class 7), a progress bar that tells the truth and status lines (class 8), and an
out-of-memory named by phase (class 5). Real processes and files on the shipped demo model."""

from __future__ import annotations

import json
import os
import pathlib
import re
import resource
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import ditax
from ditax.cli import main
from xla_test_flags import xla_flags

DEMO = pathlib.Path(ditax.__file__).parent / "assets" / "demo_model"
pytestmark = pytest.mark.skipif(not (DEMO / "model_index.json").is_file(),
                                reason="the demo model is not in this checkout")
LONG = " ".join(["a red circle moves right and a blue square moves up"] * 3)


def _env():
    env = dict(os.environ, JAX_PLATFORMS="cpu", DITAX_CACHE_DIR="none",
               XLA_FLAGS=xla_flags(1))
    env.pop("PYTEST_CURRENT_TEST", None)
    return env


def _ditax(*argv, timeout=240, limit_memory=False):
    """``python -m ditax.cli ARGV`` in a fresh process; with ``limit_memory`` its address space
    is capped at 16 GiB so a too-large allocation fails at once on any host."""
    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (16 << 30, 16 << 30))
    return subprocess.run([sys.executable, "-m", "ditax.cli", *map(str, argv)], env=_env(),
                          capture_output=True, text=True, timeout=timeout,
                          preexec_fn=cap if limit_memory else None)


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """One generation of the demo model *by path* with no size flags, a prompt longer than its
    16 text tokens, 4 steps, an mp4 and PNG frames in folders that do not exist yet."""
    out = tmp_path_factory.mktemp("gen")
    r = _ditax("generate", "--model", DEMO, "--prompt", LONG, "--steps", 4,
               "--output", out / "new" / "v.mp4", "--frames-dir", out / "frames")
    return r, out


@pytest.fixture(scope="module")
def pipe():
    return ditax.load_pipeline(DEMO)


# --- class 4: outputs checked before anything loads, written whole

@pytest.mark.parametrize("case, flags, match", [
    ("output_is_folder", ["--output", "{d}"], r"--output .*dir is an existing folder; give a "
                                             r"file name inside it, e\.g\. --output .*out\.mp4"),
    ("output_is_mp4_folder", ["--output", "{m}"], r"--output .* is an existing folder"),
    ("parent_is_file", ["--output", "{f}/x.mp4"], r"is a file, not a folder"),
    ("frames_is_file", ["--frames-dir", "{f}"], r"--frames-dir .* is an existing file"),
    ("frames_not_empty", ["--frames-dir", "{full}"], r"already has files; choose a new or empty"),
    ("frames_is_output", ["--output", "{d}/a.mp4", "--frames-dir", "{d}/a.mp4"],
     r"is the --output path"),
])
def test_outputs_are_checked_before_anything_loads(tmp_path, capsys, case, flags, match):
    d = tmp_path / "dir"
    d.mkdir()
    f = tmp_path / "file.txt"
    f.write_text("x")
    full = tmp_path / "full"
    full.mkdir()
    (full / "frame_00000.png").write_bytes(b"old")
    m = tmp_path / "old.mp4"
    m.mkdir()
    flags = [a.format(d=d, f=f, full=full, m=m) for a in flags]
    if "--output" not in flags:
        flags += ["--output", str(tmp_path / "o.mp4")]
    before = sorted(tmp_path.rglob("*"))
    rc = main(["generate", "--model", "demo", "--prompt", "a red circle moves up", *flags])
    cap = capsys.readouterr()
    assert rc == 2, cap.err
    assert re.search(match, cap.err), cap.err
    assert "compile cache" not in cap.out          # refused before the model was touched
    assert sorted(tmp_path.rglob("*")) == before   # and nothing created or changed
    assert (full / "frame_00000.png").read_bytes() == b"old"


_WRITER = """
import sys, numpy as np
from ditax.io.video import write_frames, write_mp4
# uint8 frames (written as they are): the float video and its conversion took seconds
video = np.random.default_rng(0).integers(0, 256, (2000, 128, 128, 3), dtype=np.uint8)
print("start", flush=True)
(write_mp4 if sys.argv[1] == "mp4" else write_frames)(sys.argv[2], video)
"""


@pytest.mark.parametrize("kind", ["mp4", "frames"])
def test_a_killed_write_leaves_nothing_under_the_requested_name(tmp_path, kind):
    """kill -9 in the middle of writing: the mp4 / frame folder does not exist (only the
    hidden ``.partial`` sibling the writer was filling)."""
    target = tmp_path / ("v.mp4" if kind == "mp4" else "frames")
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, kind, str(target)], env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "start"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:      # wait until the writer has written something
            partial = [p for p in tmp_path.iterdir() if ".partial" in p.name]
            if partial and (partial[0].is_file() and partial[0].stat().st_size > 0
                            or partial[0].is_dir() and len(list(partial[0].iterdir())) > 2):
                break
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.05)
        else:
            pytest.fail("the writer never started writing")
        assert not target.exists()
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not target.exists(), sorted(tmp_path.iterdir())


def test_frames_and_mp4_appear_whole(demo_run):
    r, out = demo_run
    assert r.returncode == 0, r.stderr
    frames = sorted((out / "frames").iterdir())
    assert [p.name for p in frames] == [f"frame_{i:05d}.png" for i in range(17)]
    assert [p.name for p in out.rglob("*") if ".partial" in p.name] == []
    from ditax.io.video import read_video

    assert read_video(out / "new" / "v.mp4").shape == (17, 64, 64, 3)


# --- class 6: nothing silent

def test_long_prompt_is_cut_with_a_warning_naming_the_tokens_dropped(demo_run, pipe, caplog):
    r, _ = demo_run
    backend = pipe.tokenizer.backend
    backend.no_truncation()
    backend.no_padding()
    n = len(backend.encode(LONG).ids)                        # its full length
    assert n > 16
    pipe.tokenizer.encode(LONG, 16)
    want = f"has {n} tokens, more than max_sequence_length=16: the last {n - 16} token(s)"
    assert want in r.stderr                                   # on the CLI
    assert any(want in m for m in caplog.messages)            # and in the library's log
    caplog.clear()
    pipe.tokenizer.encode("a red circle moves up", 16)
    assert caplog.messages == []


@pytest.mark.parametrize("seed", [-1, 2 ** 32, 2 ** 64])
def test_seed_outside_32_bits_is_refused_not_wrapped(capsys, pipe, seed):
    rc = main(["generate", "--model", "demo", "--prompt", "a red circle moves up",
               "--seed", str(seed), "--output", "never.mp4"])
    err = capsys.readouterr().err
    assert rc == 2 and "outside [0, 2**32" in err, err
    assert not pathlib.Path("never.mp4").exists()
    with pytest.raises(ditax.errors.RequestError, match=r"seed=.* outside \[0, 2\*\*32"):
        pipe("a red circle moves up", seed=seed, num_inference_steps=1)


def test_largest_seed_runs(pipe):
    v = pipe("a red circle moves up", seed=2 ** 32 - 1, num_inference_steps=1, progress=False)
    assert v.shape == (17, 64, 64, 3)


@pytest.mark.parametrize("prompts, match", [
    (["a red circle moves up"], r"--prompts got 1 prompt\(s\); calibration takes 2-8"),
    ([f"a red circle moves up {i}" for i in range(9)], r"got 9 prompt\(s\)"),
])
def test_calibrate_cache_enforces_its_prompt_count(tmp_path, capsys, prompts, match):
    out = tmp_path / "n.json"
    rc = main(["calibrate-cache", "--model", "demo", "--prompts", *prompts, "--output", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and re.search(match, err), err
    assert not out.exists()


def test_calibrate_cache_checks_every_prompts_seed(capsys, tmp_path):
    rc = main(["calibrate-cache", "--model", "demo", "--seed", str(2 ** 32 - 2), "--output",
               str(tmp_path / "n.json")])           # 4 demo prompts: seeds up to 2**32 + 1
    err = capsys.readouterr().err
    assert rc == 2 and "one per prompt" in err, err


# --- class 7: a folder's own sampling defaults

def test_demo_by_path_samples_at_its_own_size(demo_run):
    r, _ = demo_run
    assert "wrote" in r.stdout and "(17 frames, 64x64, 16 fps)" in r.stdout, r.stdout


def test_library_uses_the_folder_defaults_and_explicit_arguments_win(pipe):
    from ditax.demo import SAMPLE

    shipped = json.loads((DEMO / "ditax_sample.json").read_text())
    assert SAMPLE == shipped == pipe.sample_defaults
    assert pipe.max_sequence_length == shipped["max_sequence_length"]
    assert pipe("a red circle moves up", num_inference_steps=1,
                progress=False).shape == (17, 64, 64, 3)
    assert pipe("a red circle moves up", height=32, width=48, num_frames=5,
                num_inference_steps=1, progress=False).shape == (5, 32, 48, 3)


def test_the_demo_recipe_writes_the_shipped_defaults(tmp_path):
    from ditax.demo import sample_defaults, write_sample_defaults
    from ditax.recipes.demo_model import FULL

    path = write_sample_defaults(tmp_path, sample_defaults(FULL.height, FULL.width, FULL.frames,
                                                           FULL.text_len))
    assert json.loads(path.read_text()) == json.loads((DEMO / "ditax_sample.json").read_text())


@pytest.fixture()
def folder_with(tmp_path):
    """A copy of the demo folder whose ditax_sample.json is ``text``."""
    def make(text: str) -> pathlib.Path:
        root = tmp_path / "model"
        shutil.copytree(DEMO, root)
        (root / "ditax_sample.json").write_text(text)
        return root
    return make


@pytest.mark.parametrize("text, match", [
    ('{"heigth": 64}', r"ditax_sample.json: unknown key 'heigth' \(did you mean 'height'\?\)"),
    ('{"height": -64}', r"ditax_sample.json: height=-64 must be a positive int"),
    ('{"guidance_scale": "high"}', r"ditax_sample.json: guidance_scale=\"high\" must be a "),
    ('{"num_frames": 16}', r"ditax_sample.json: num_frames=16 must be of the form 4k\+1"),
    ('{"height": 64,\n "width": 64,}', r"ditax_sample.json line 2 column .*not valid JSON"),
    ('[64, 64]', r"ditax_sample.json must hold a JSON object"),
])
def test_a_bad_defaults_file_is_one_line_naming_file_and_key(folder_with, capsys, text, match):
    root = folder_with(text)
    rc = main(["generate", "--model", str(root), "--prompt", "a red circle moves up",
               "--output", str(root.parent / "o.mp4")])
    err = capsys.readouterr().err
    assert rc == 2 and re.search(match, err), err
    assert str(root / "ditax_sample.json") in err and len(err.strip().splitlines()) == 1
    with pytest.raises(ditax.pipelines.wan.folder.PipelineLoadError, match=match):
        ditax.load_pipeline(root)


def test_a_size_off_the_model_grid_names_the_file_as_it_loads(folder_with):
    root = folder_with('{"height": 72}')       # 72 % 16 != 0 (VAE 4 x patch 4)
    with pytest.raises(ditax.pipelines.wan.folder.PipelineLoadError,
                       match=r"ditax_sample.json: height=72 must be a positive multiple of 16"):
        ditax.load_pipeline(root)


# --- class 8: the progress bar tells the truth; status lines; --no-progress everywhere

def _rate(stderr: str) -> float:
    """Steps per second of the denoise bar's final update."""
    m = re.findall(r"denoise: 100%.*?(\d+)/\1 \[[^,\]]*, *([\d.]+)(step/s|s/step)\]", stderr)
    assert m, stderr
    n, v, unit = m[-1]
    return float(v) if unit == "step/s" else 1.0 / float(v)


def test_the_bar_counts_finished_steps(pipe, capsys):
    """Warm (compiled) call of 8 steps: a bar counting dispatches reaches 8/8 at hundreds of
    steps/s while the device is still at the first; counting finished steps, its rate is the
    denoise phase's (8 / its seconds)."""
    kw = dict(num_inference_steps=8, seed=1)
    pipe("a red circle moves up", progress=False, **kw)
    capsys.readouterr()
    pipe("a red circle moves up", progress=True, **kw)
    rate = _rate(capsys.readouterr().err)
    assert rate <= 2.0 * 8 / pipe.timings.denoise, (rate, pipe.timings.denoise)


def test_loading_and_compiling_show_a_status_line(demo_run):
    r, _ = demo_run
    for line in ("ditax: loading the model ...", "ditax: compiling ...", "ditax: decoding ..."):
        assert line in r.stderr


@pytest.mark.parametrize("command", ["generate", "train", "train-vae", "calibrate-cache",
                                     "bench", "preprocess"])
def test_every_long_command_has_no_progress(capsys, command):
    assert main([command, "--help"]) == 0
    assert "--no-progress" in capsys.readouterr().out


# --- class 5: an out-of-memory says which phase and what to lower

def test_out_of_memory_names_the_phase_and_what_to_lower(tmp_path):
    """4096x4096 on the demo model: the attention scores of 65,536 tokens (344 GB) cannot be
    allocated. One line on stderr (--no-progress: nothing else), exit 1, no mp4."""
    r = _ditax("generate", "--model", "demo", "--prompt", "a red circle moves up",
               "--height", 4096, "--width", 4096, "--frames", 1, "--steps", 1, "--no-progress",
               "--output", tmp_path / "o.mp4", limit_memory=True)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 1, r.stderr
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("ditax generate: error: out of memory while denoising ("), lines
    assert "lower --height / --width / --frames" in lines[0]
    assert "attention.backend=" in lines[0] and "mesh.context" in lines[0]
    assert list(tmp_path.iterdir()) == []


def test_out_of_memory_in_training_names_the_step_and_the_batch():
    """A real failed allocation inside the phase ``ditax train`` wraps its work in."""
    import jax.numpy as jnp

    from ditax.cli.oom import is_out_of_memory, oom_message
    from ditax.phases import phase

    with pytest.raises(Exception) as info:
        with phase("train"):
            jnp.zeros((2 ** 38,), jnp.float32).block_until_ready()   # 1 TiB
    assert is_out_of_memory(info.value)
    msg = oom_message(info.value, "train")
    assert msg.startswith("out of memory while running a training step (RESOURCE_EXHAUSTED")
    assert "lower batch_size" in msg and "model.remat=full" in msg and "\n" not in msg
    assert not is_out_of_memory(ValueError("height=17"))
