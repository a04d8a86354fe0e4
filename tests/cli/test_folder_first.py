"""Issue 40, item 2: a sampling command resolves its model folder FIRST — a path that is no
pipeline folder is one line naming it before any family's request rule — then loads the
config of the folder's family, validated once against the folder's own transformer:

- a Flux folder takes its own ``model.*`` keys (``model.guidance_embeds``); a key of another
  family, or a ``model.family`` that contradicts the folder, is refused naming the folder's;
- ``mesh.tensor=8`` is checked against the folder's heads: it runs on an 8-head Wan folder (8
  fake CPU devices) and is refused on the 5-head shipped demo naming its 5 heads;
- a missing folder, an uncached hub id (``HF_HUB_OFFLINE=1``), a training run folder, a
  component folder and a pipeline class ditax does not run are each reported as such, not
  with Wan's request rules (``--output`` suffix, sizes);
- ``--model flux-demo`` names the shipped small Flux.

Real folders (the shipped ones, linked) and the CLI through ``ditax.cli.main``."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from ditax.cli import main
from ditax.front.folder import folder_request
from ditax.demo import flux_model_path, model_path

pytestmark = pytest.mark.skipif(
    not (model_path().parent / "flux_demo_model" / "model_index.json").is_file(),
    reason="the shipped models are not in this checkout")


def _fails(capsys, argv) -> str:
    """``ditax ARGV`` exits 2 with one ``ditax generate: error:`` line; returns it."""
    rc = main([str(a) for a in argv])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith(f"ditax {argv[0]}: error: "), err
    return err[0]


def _linked_copy(src: pathlib.Path, dst: pathlib.Path) -> pathlib.Path:
    """``dst``: ``src``'s components linked, ``transformer/`` a folder of its own (its weights
    linked) so its ``config.json`` can be edited."""
    dst.mkdir(parents=True)
    for part in src.iterdir():
        if part.name != "transformer":
            (dst / part.name).symlink_to(part)
    (dst / "transformer").mkdir()
    for f in (src / "transformer").iterdir():
        if f.name != "config.json":
            (dst / "transformer" / f.name).symlink_to(f)
    return dst


def _edit_transformer(folder: pathlib.Path, src: pathlib.Path, **changes) -> None:
    cfg = json.loads((src / "transformer" / "config.json").read_text())
    (folder / "transformer" / "config.json").write_text(json.dumps({**cfg, **changes}))


# -- the folder's family decides the model keys -------------------------------------------------


def test_flux_folder_takes_its_own_model_keys(tmp_path, capsys):
    own = json.loads((flux_model_path() / "transformer" / "config.json").read_text())
    value = str(own["guidance_embeds"]).lower()
    req = folder_request("flux-demo", [f"model.guidance_embeds={value}"])
    assert req.root == flux_model_path() and req.pipelines.name == "flux"
    assert req.cfg.model.family == "flux"
    assert req.cfg.model.guidance_embeds is own["guidance_embeds"]
    # the folder's fields under the overrides: the config is the folder's model
    assert req.cfg.model.num_attention_heads == own["num_attention_heads"]
    assert req.given == {"model": {"guidance_embeds": own["guidance_embeds"]}}
    out = tmp_path / "flux.png"
    rc = main(["generate", "--model", "flux-demo", "--prompt", "a red circle on the left",
               "--height", "64", "--width", "64", "--steps", "2", "--no-progress",
               "--output", str(out), f"model.guidance_embeds={value}"])
    assert rc == 0, capsys.readouterr().err
    assert out.is_file()


def test_a_key_of_another_family_is_refused_naming_the_folders(capsys):
    line = _fails(capsys, ["generate", "--model", "flux-demo", "--prompt", "x",
                           "--output", "x.png", "model.vace_layers=0"])
    assert "model.vace_layers is not a key of flux models" in line, line
    assert f"{flux_model_path()} is a FluxPipeline folder" in line, line
    assert "guidance_embeds" in line, line          # its own keys are listed
    # a typo of its own key is suggested
    line = _fails(capsys, ["generate", "--model", "flux-demo", "--prompt", "x",
                           "--output", "x.png", "model.guidance_embed=true"])
    assert "did you mean model.guidance_embeds?" in line, line


def test_a_model_family_that_contradicts_the_folder_is_refused(capsys):
    line = _fails(capsys, ["generate", "--model", "flux-demo", "--prompt", "x",
                           "--output", "x.png", "model.family=wan"])
    assert "model.family='wan' contradicts the model" in line and "FluxPipeline" in line, line
    # repeating the folder's own family is fine
    assert folder_request("flux-demo", ["model.family=flux"]).cfg.model.family == "flux"


# -- the config is validated against the folder's transformer -------------------------------


def test_mesh_tensor_8_runs_on_an_8_head_wan_folder(tmp_path, capsys):
    demo = model_path()
    cfg = json.loads((demo / "transformer" / "config.json").read_text())
    width = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    assert width % 8 == 0 and (width // 8) % 2 == 0, cfg   # 8 heads of an even head dim
    folder = _linked_copy(demo, tmp_path / "wan8")
    # the same weights read as 8 heads (Wan's projections and q/k norms span the whole width)
    _edit_transformer(folder, demo, num_attention_heads=8, attention_head_dim=width // 8)
    assert folder_request(str(folder), ["mesh.tensor=8"]).cfg.model.num_attention_heads == 8
    out = tmp_path / "v.mp4"
    rc = main(["generate", "--model", str(folder), "--prompt", "a red circle moves right",
               "--steps", "2", "--frames", "5", "--height", "32", "--width", "32",
               "--no-progress", "--output", str(out), "mesh.tensor=8"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "'tensor': 8" in captured.out and out.is_file()


def test_mesh_tensor_is_checked_against_the_folders_heads(capsys):
    heads = json.loads((model_path() / "transformer" / "config.json").read_text())[
        "num_attention_heads"]
    assert heads % 8
    line = _fails(capsys, ["generate", "--model", "demo", "--prompt", "x", "mesh.tensor=8"])
    assert f"num_attention_heads={heads}" in line or f"{heads} heads" in line, line


# -- a path that is no model folder: one line before any family rule ------------------------


def _no_family_rule(line: str) -> None:
    for rule in ("must end in", "multiple of 16", "4k+1"):
        assert rule not in line, line


def test_missing_folder_is_named_before_request_rules(tmp_path, capsys):
    line = _fails(capsys, ["generate", "--model", tmp_path / "nope", "--prompt", "x",
                           "--output", "x.png", "--height", "72"])
    assert f"--model {tmp_path / 'nope'}: no such folder" in line, line
    _no_family_rule(line)


def test_training_run_folder_is_named(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("steps: 1\n")
    (run / "lora.safetensors").write_bytes(b"")
    line = _fails(capsys, ["generate", "--model", run, "--prompt", "x", "--output", "x.png"])
    assert f"--model {run} is a training run folder (config.yaml, checkpoints/)" in line, line
    assert "not a pipeline folder (model_index.json)" in line and "--lora" in line, line
    _no_family_rule(line)


def test_component_folder_points_at_its_pipeline(capsys):
    part = model_path() / "transformer"
    line = _fails(capsys, ["generate", "--model", part, "--prompt", "x", "--height", "72"])
    assert "is a WanTransformer3DModel folder (config.json)" in line, line
    assert line.endswith(f"pass the pipeline folder that holds it, {model_path()}"), line
    _no_family_rule(line)


def test_unsupported_pipeline_class_is_named(tmp_path, capsys):
    folder = tmp_path / "sd"
    folder.mkdir()
    (folder / "model_index.json").write_text(json.dumps(
        {"_class_name": "StableDiffusionPipeline"}))
    line = _fails(capsys, ["generate", "--model", folder, "--prompt", "x", "--output", "x.png"])
    assert (f"_class_name 'StableDiffusionPipeline' in {folder / 'model_index.json'} is not a "
            f"pipeline ditax runs; it runs ") in line, line
    assert "WanPipeline" in line and "FluxPipeline" in line, line
    _no_family_rule(line)


def test_uncached_hub_id_offline_is_named(tmp_path):
    from loopback import silent_endpoint

    with silent_endpoint() as (url, hits):
        env = {**os.environ, "HF_HUB_OFFLINE": "1",
               "HF_HUB_CACHE": str(tmp_path / "empty-cache"), "HF_ENDPOINT": url,
               "JAX_PLATFORMS": "cpu"}
        res = subprocess.run([sys.executable, "-m", "ditax.cli", "generate", "--model",
                              "someorg/missing-model", "--prompt", "x", "--output", "x.png",
                              "--height", "72"], env=env, capture_output=True, text=True,
                             timeout=240, cwd=tmp_path)
    assert hits == [], "the offline check connected to the hub endpoint"
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert "--model someorg/missing-model: no such folder" in lines[0], lines
    assert "HF_HUB_OFFLINE=1" in lines[0], lines
    _no_family_rule(lines[0])


def test_flux_demo_names_the_shipped_small_flux():
    from ditax.cli import model_arg

    assert model_arg("flux-demo") == str(flux_model_path())
    assert model_arg("demo") == str(model_path())
    assert model_arg("flux-demo/x") == "flux-demo/x"
