"""The ``ditax`` command line: exit codes (0 ok, 2 bad request / config, 1 failure), one-line
errors without a traceback (``--debug`` shows it), the user mistakes that must end cleanly
(missing model folder, truncated weights, an attention backend this machine cannot run), the
lazy public surface with the library's real signatures, and ``plan --devices`` choosing the
platform through the mesh."""

import inspect
import json
import shutil
import subprocess
import sys

import pytest

import ditax
import ditax.attention
from ditax.cli import main
from ditax.demo.folders import TRANSFORMER, write_transformer
from random_pipeline import random_pipeline_folder

def run_cli(capsys, *argv):
    """``main(argv)`` → (exit code, stdout, stderr lines)."""
    rc = main([str(a) for a in argv])
    cap = capsys.readouterr()
    return rc, cap.out, [ln for ln in cap.err.splitlines() if ln.strip()]


def assert_one_line(err, prog, *words):
    assert len(err) == 1, err
    assert err[0].startswith(f"{prog}: error: "), err
    assert "Traceback" not in err[0]
    for w in words:
        assert w in err[0], err


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    return random_pipeline_folder(tmp_path_factory.mktemp("cli") / "pipeline")


def truncated_copy(folder, dest):
    shutil.copytree(folder, dest)
    f = next(dest.rglob("transformer/*.safetensors"), None) or next(dest.glob("*.safetensors"))
    f.write_bytes(f.read_bytes()[:-100])
    return dest


# ----------------------------------------------------------------------------------------------
# usage errors and failures


@pytest.mark.parametrize("argv,prog,words", [
    ([], "ditax", ["no command given", "generate"]),
    (["bogus"], "ditax", ["'bogus'", "choose from"]),
    (["generate", "--prompt", "a cat"], "ditax generate", ["--model", "ditax generate --help"]),
    (["plan", "tiny", "--latent", "1,2"], "ditax plan", ["'1,2'", "F,Y,X"]),
    (["plan", "tiny", "mesh.fdsp=2"], "ditax plan", ["mesh.fdsp", "mesh.fsdp"]),
])
def test_usage_and_config_errors_exit_2_in_one_line(capsys, argv, prog, words):
    rc, _, err = run_cli(capsys, *argv)
    assert rc == 2
    assert_one_line(err, prog, *words)


def test_help_exits_0(capsys):
    assert main(["--help"]) == 0
    assert "generate" in capsys.readouterr().out


def test_unexpected_error_is_one_line_and_debug_shows_the_traceback(capsys, monkeypatch):
    from ditax.cli import plan as plan_cmd

    def boom(args):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(plan_cmd, "run", boom)
    rc, _, err = run_cli(capsys, "plan", "tiny")
    assert rc == 1
    assert_one_line(err, "ditax plan", "RuntimeError: disk on fire", "rerun with --debug")
    for argv in (["--debug", "plan", "tiny"], ["plan", "tiny", "--debug"]):
        rc, _, err = run_cli(capsys, *argv)
        assert rc == 1
        assert err[0].startswith("Traceback") and err[-1].startswith("ditax plan: error: ")
        assert "RuntimeError: disk on fire" in err[-1]


def test_python_m_and_help_do_not_start_jax():
    code = ("import sys; from ditax.cli import main; rc = main(['--help']); "
            "assert 'jax' not in sys.modules, 'jax imported'; import ditax; "
            "assert 'jax' not in sys.modules; sys.exit(rc)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    res = subprocess.run([sys.executable, "-m", "ditax.cli", "generate"], capture_output=True,
                         text=True)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "ditax generate: error: the following arguments are required: --model "
        "(see ditax generate --help)"]
    # the request's flags come from every family's fields, read without starting JAX
    code = ("import sys; from ditax.cli import main; rc = main(['generate', '--help']); "
            "assert 'jax' not in sys.modules, 'jax imported'; sys.exit(rc)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0 and "--true-cfg" in res.stdout and "--frames" in res.stdout, \
        res.stderr


# ----------------------------------------------------------------------------------------------
# the three user mistakes of issue 9


@pytest.mark.parametrize("make", ["missing", "empty"])
def test_missing_model_folder(tmp_path, capsys, make):
    model = tmp_path / "models" / "wan"
    if make == "empty":
        model.mkdir(parents=True)
    rc, _, err = run_cli(capsys, "generate", "--model", model, "--prompt", "a cat",
                         "--output", tmp_path / "o.mp4")
    assert rc == 2
    assert_one_line(err, "ditax generate", str(model))
    assert not (tmp_path / "o.mp4").exists()
    rc, _, err = run_cli(capsys, "convert", model)
    assert rc == 2
    assert_one_line(err, "ditax convert", str(model))


def test_truncated_weights(tmp_path, capsys, pipeline):
    bad = truncated_copy(pipeline, tmp_path / "trunc")
    rc, _, err = run_cli(capsys, "convert", bad)
    assert_one_line(err, "ditax convert", "truncated")
    assert rc == 2
    rc, _, err = run_cli(capsys, "generate", "--model", bad, "--prompt", "a cat", "--height",
                         "32", "--width", "32", "--frames", "5", "--steps", "1", "--no-progress",
                         "--output", tmp_path / "o.mp4")
    assert_one_line(err, "ditax generate", "truncated")
    assert rc == 2


def test_cudnn_on_cpu_is_refused_before_loading(tmp_path, capsys):
    # a folder with configs but no weights: loading would fail differently, so the error must
    # come from the check that runs before any weights are read
    folder = tmp_path / "pipe"
    (folder / "transformer").mkdir(parents=True)
    (folder / "model_index.json").write_text(json.dumps({"_class_name": "WanPipeline"}))
    (folder / "transformer" / "config.json").write_text(json.dumps(
        {"_class_name": "WanTransformer3DModel", **TRANSFORMER}))
    rc, _, err = run_cli(capsys, "generate", "--model", folder, "--prompt", "a cat",
                         "--output", tmp_path / "o.mp4", "attention.backend=cudnn")
    assert rc == 2
    assert_one_line(err, "ditax generate", "cudnn")


def test_convert_ok_and_shape_mismatch(tmp_path, capsys):
    folder = tmp_path / "transformer"
    write_transformer(folder)
    rc, out, err = run_cli(capsys, "convert", folder)
    assert rc == 0 and "OK" in out and not err
    cfg = json.loads((folder / "config.json").read_text())
    cfg["ffn_dim"] = cfg["ffn_dim"] * 2
    (folder / "config.json").write_text(json.dumps(cfg))
    rc, _, err = run_cli(capsys, "convert", folder)
    assert rc == 2
    assert_one_line(err, "ditax convert", "ffn.net.0.proj.weight", "the model expects")


# ----------------------------------------------------------------------------------------------
# plan: the platform through the mesh


def test_plan_devices_builds_the_mesh_from_cpu_devices(capsys):
    rc, out, _ = run_cli(capsys, "plan", "tiny", "--devices", "4", "mesh.fsdp=-1", "--json")
    assert rc == 0
    assert json.loads(out)["mesh"]["fsdp"] == 4
    # JAX already runs here with 8 CPU devices: asking for more is a request error, not a
    # change of the running process's environment
    rc, _, err = run_cli(capsys, "plan", "tiny", "--devices", "16", "--json")
    assert rc == 2
    assert_one_line(err, "ditax plan", "--devices=16", "8 CPU device(s)")


def test_plan_devices_sets_up_jax_before_it_starts(tmp_path):
    res = subprocess.run([sys.executable, "-m", "ditax.cli", "plan", "tiny", "--devices", "16",
                          "mesh.fsdp=-1", "--json"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["mesh"]["fsdp"] == 16


# ----------------------------------------------------------------------------------------------
# public surface


def test_public_surface_is_the_library_itself():
    from ditax.load import load_transformer
    from ditax.pipelines.load import load_pipeline

    assert ditax.load_transformer is load_transformer
    assert ditax.load_pipeline is load_pipeline
    params = list(inspect.signature(ditax.load_transformer).parameters)
    assert params[:4] == ["path", "dtype", "mesh", "attention"]
    assert list(inspect.signature(ditax.load_pipeline).parameters)[:4] == params[:4]
    for name in ditax.__all__:
        assert getattr(ditax, name) is not None, name
        assert name in dir(ditax)
    assert isinstance(ditax.attention, type(inspect))
    assert issubclass(ditax.ConfigError, ditax.DitaxError)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        ditax.nope  # noqa: B018
