"""``ditax export RUN_DIR --out FOLDER`` (issue 41, class 7): a full fine-tune's checkpoint as a
pipeline folder that ditax and diffusers load, its transformer the checkpoint's; a Flux run
too; every bad input one line, exit 2, nothing written.

A tiny Wan run (the demo's random pipeline as init_from, synthetic data, 2 steps, a checkpoint
each) and a Flux one (the shipped small Flux as init_from, 1 step), trained in this process
with most XLA optimisations off (``fast_compile``)."""

import json

import jax
import numpy as np
import pytest
import yaml
from flax import nnx

import ditax
from ditax.cli import main
from ditax.config import load_config
from ditax.parallel.mesh import make_mesh
from ditax.train.loop import train
from random_pipeline import folder_fields

pytestmark = pytest.mark.usefixtures("fast_compile")
ONE = dict(data=1, fsdp=1, context=1, tensor=1)
DATA = {"tiny": ["data.num_frames=1", "data.height=32", "data.width=32", "data.text_len=8"],
        "flux-tiny": ["data.height=32", "data.width=32", "data.text_len=8"]}


def _run(root, preset, folder, steps, one_device=False):
    """``ditax train PRESET`` from ``folder`` (the model fields set to the folder's) for
    ``steps`` steps (fsdp over the 8 devices), a checkpoint each step; returns (run dir, config).
    ``one_device``: the same run through ``ditax.train.loop.train`` on one device (its step
    compiles cheaper than the 8-device one: the Flux test took 6.9 CPU s that way, ~5 s this;
    export reads either checkpoint)."""
    fields = folder_fields(folder, preset)
    out = root / f"run-{preset}"
    args = [*fields, f"init_from={folder}", *DATA[preset], f"steps={steps}", "batch_size=8",
            "checkpoint.every=1", "checkpoint.keep=5", f"output_dir={out}"]
    cfg = load_config(preset, args)
    if one_device:
        train(cfg, mesh=make_mesh(ONE, jax.devices()[:1]), progress=False)
    else:
        assert main(["train", preset, *args, "--no-progress"]) == 0
    return out, cfg


def _checkpoint_params(run, cfg, step):
    """The model parameters at ``step`` as training restores them (the Trainer's state)."""
    import orbax.checkpoint as ocp

    from ditax.train.checkpoint import Checkpointer
    from ditax.train.step import Trainer

    tr = Trainer(cfg, make_mesh(ONE, jax.devices()[:1]))
    ck = Checkpointer(run / "checkpoints", cfg.checkpoint)
    got = ck.mgr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(tr.abstract_state()), data=ocp.args.JsonRestore()))
    ck.close()
    return jax.tree.map(np.asarray, got["state"]["params"])


def _params_of(pipe):
    """A pipeline's (or a transformer's) transformer parameters as numpy."""
    module = getattr(pipe, "transformer", pipe).module
    return jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(module, nnx.Param)))


def _assert_equal_trees(a, b):
    fa, fb = (dict(jax.tree_util.tree_flatten_with_path(t)[0]) for t in (a, b))
    assert fa.keys() == fb.keys()
    for k in fa:
        np.testing.assert_array_equal(fa[k], fb[k], err_msg=jax.tree_util.keystr(k))


@pytest.fixture(scope="module")
def wan(tmp_path_factory):
    from random_pipeline import random_pipeline_folder

    root = tmp_path_factory.mktemp("export")
    pipe = random_pipeline_folder(root / "pipe")
    run, cfg = _run(root, "tiny", pipe, 2)
    return root, pipe, run, cfg


def test_a_wan_run_exports_a_folder_ditax_and_diffusers_load(wan, capsys):
    root, pipe, run, cfg = wan
    capsys.readouterr()
    out = root / "exported"
    assert main(["export", str(run), "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert f"wrote {out}: transformer from checkpoint step 2 of {run}" in said, said
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in pipe.iterdir())
    assert not any(p.is_symlink() for p in out.iterdir())
    for name in ("vae", "text_encoder", "tokenizer", "scheduler"):     # copied as they were
        for f in (pipe / name).rglob("*"):
            if f.is_file():
                assert (out / name / f.relative_to(pipe / name)).read_bytes() == f.read_bytes()

    trained = _checkpoint_params(run, cfg, 2)
    _assert_equal_trees(_params_of(ditax.load_pipeline(str(out))), trained)
    start = _params_of(ditax.load_transformer(str(pipe)))   # the run did move the weights
    assert not np.array_equal(start["blocks"]["ffn"]["proj_in"]["kernel"],
                              trained["blocks"]["ffn"]["proj_in"]["kernel"])

    torch = pytest.importorskip("torch")
    diffusers = pytest.importorskip("diffusers")
    from wan_reference import rel_err, run_diffusers

    ref = diffusers.WanPipeline.from_pretrained(str(out), dtype=torch.float32)
    rng = np.random.default_rng(0)
    latents = rng.standard_normal((1, 16, 2, 8, 8)).astype(np.float32)
    t = np.array([500.0], np.float32)
    text = rng.standard_normal((1, 8, 64)).astype(np.float32)
    theirs = run_diffusers(ref.transformer.eval(), latents, t, text)
    ours = np.asarray(ditax.load_transformer(str(out))(latents, t, text))
    assert rel_err(ours, theirs) <= 1e-5


def test_step_dtype_and_link(wan, capsys, monkeypatch):
    """``--step 1`` is step 1's weights; ``--dtype bfloat16`` casts them; ``--link`` links the
    base's components instead of copying them; paths relative to the current folder."""
    root, pipe, run, cfg = wan
    out = root / "step1"
    monkeypatch.chdir(root)
    assert main(["export", run.name, "--out", out.name, "--step", "1", "--dtype", "bfloat16",
                 "--link"]) == 0
    assert "linked from" in capsys.readouterr().out
    assert (out / "vae").is_symlink() and (out / "vae").resolve() == (pipe / "vae").resolve()
    got = _params_of(ditax.load_pipeline(str(out)))
    want = jax.tree.map(lambda x: np.asarray(jax.numpy.asarray(x, jax.numpy.bfloat16),
                                             np.float32), _checkpoint_params(run, cfg, 1))
    _assert_equal_trees(got, want)


def test_bad_inputs_are_one_line_and_write_nothing(wan, tmp_path, capsys):
    root, pipe, run, cfg = wan
    saved = yaml.safe_load((run / "config.yaml").read_text())

    def run_like(name, checkpoints=False, **changes):
        d = tmp_path / name
        d.mkdir()
        if checkpoints:
            (d / "checkpoints").symlink_to(run / "checkpoints")
        else:
            (d / "checkpoints").mkdir()
        (d / "config.yaml").write_text(yaml.safe_dump({**saved, **changes}))
        return d

    lora = run_like("lora", lora={**saved["lora"], "rank": 4})
    vae = run_like("vae")
    (vae / "config.yaml").write_text(yaml.safe_dump({"vae": {"base_dim": 16}, "steps": 1}))
    for f in ("lora.safetensors", "lora_comfyui.safetensors"):
        (lora / f).write_bytes(b"")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    cases = [
        ([str(pipe)], f"RUN_DIR {pipe} has no config.yaml, so it is no training run"),
        ([str(tmp_path / "nowhere")], "does not exist"),
        ([str(run_like("empty"))], "holds no finished checkpoint"),
        ([str(run), "--step", "7"], f"--step 7: {run} has checkpoints at steps 1, 2"),
        ([str(run), "--out", str(tmp_path / "full")], "exists and is not an empty folder"),
        ([str(run_like("scratch", True, init_from=None))], "trained without init_from, so it "
                                                           "has no pipeline"),
        ([str(run), "--base", str(ditax.demo.flux_model_path())],
         "is a flux pipeline folder, but the run trained a wan model"),
        ([str(vae)], f"is a VAE run (ditax train-vae): its VAE is written as a diffusers "
                     f"folder in {vae / 'vae'}"),
        ([str(lora)], f"is a LoRA run (lora.rank=4): its adapters are already written as "
                      f"LoRA files: {lora / 'lora.safetensors'}"),
    ]
    for argv, words in cases:
        if "--out" not in argv:
            argv = [*argv, "--out", str(tmp_path / "new")]
        capsys.readouterr()
        assert main(["export", *argv]) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("ditax export: error: "), err
        assert words in err[0], (words, err[0])
        assert not (tmp_path / "new").exists()
    # the commands that take a pipeline or transformer folder point a run folder at export
    for argv, words in ((["convert", str(run), "--out", str(tmp_path / "new")],
                         f"ditax export {run} --out FOLDER"),
                        (["generate", "--model", str(run), "--prompt", "x"],
                         f"with ditax export {run} --out FOLDER")):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err


def test_a_flux_run_exports_too(tmp_path, capsys):
    folder = ditax.demo.flux_model_path()
    run, cfg = _run(tmp_path, "flux-tiny", folder, 1, one_device=True)
    out = tmp_path / "exported"
    assert main(["export", str(run), "--out", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    assert (out / "text_encoder_2").is_dir() and (out / "tokenizer_2").is_dir()
    assert not (out / "manifest.json").exists()     # it lists the base's transformer files
    _assert_equal_trees(_params_of(ditax.load_pipeline(str(out))),
                        _checkpoint_params(run, cfg, 1))


def test_a_full_weight_students_folder_samples_it_as_trained(wan, tmp_path):
    """A full-weight DMD2 student (issue 42): its exported folder's scheduler is the student's
    Euler with its shift, its ditax_sample.json the student's steps, guidance and sigmas;
    ditax loads them as the folder's defaults; the base's files are untouched."""
    root, pipe, _, _ = wan
    fields = folder_fields(pipe)
    run = tmp_path / "student"
    # one device, inputs noised from data (no backward simulation): what export writes is the
    # same (the student's sampling settings are its steps, sigmas, shift and guidance), and
    # the test takes ~2 CPU s less than with an 8-device DMD2 step with the rollout (11.6 -> 9.4)
    # (ditax train's own path runs in the wan fixture)
    train(load_config("tiny", [*fields, f"init_from={pipe}", *DATA["tiny"], "steps=1",
                               "batch_size=8", "distill.method=dmd2", "distill.critic_updates=1",
                               "distill.shift=5", "distill.guidance=1",
                               "distill.backward_simulation=false", f"output_dir={run}"]),
          mesh=make_mesh(ONE, jax.devices()[:1]), progress=False)
    want = json.loads((run / "ditax_sample.json").read_text())
    assert want == {"num_inference_steps": 4, "sigmas": [1.0, 0.75, 0.5, 0.25],
                    "guidance_scale": 1.0, "scheduler": "euler", "flow_shift": 5.0}
    before = (pipe / "scheduler" / "scheduler_config.json").read_text()
    assert main(["export", str(run), "--out", str(tmp_path / "folder"), "--link"]) == 0
    sched = json.loads((tmp_path / "folder" / "scheduler" / "scheduler_config.json").read_text())
    assert sched["_class_name"] == "FlowMatchEulerDiscreteScheduler" and sched["shift"] == 5.0
    assert (pipe / "scheduler" / "scheduler_config.json").read_text() == before
    own = json.loads((tmp_path / "folder" / "ditax_sample.json").read_text())
    assert own["num_inference_steps"] == 4 and own["guidance_scale"] == 1.0
    assert own["sigmas"] == [1.0, 0.75, 0.5, 0.25]
    loaded = ditax.load_pipeline(tmp_path / "folder")
    assert loaded.sample_defaults["sigmas"] == [1.0, 0.75, 0.5, 0.25]
    assert loaded.sample_defaults["num_inference_steps"] == 4
