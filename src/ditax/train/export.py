"""``ditax export``: a training run's checkpoint as a diffusers pipeline folder.

A full fine-tune's parameters at one checkpoint step (the newest by default) become the
``transformer/`` of a pipeline folder — written through the family's conversion table
(diffusers names and layouts; :func:`ditax.models.common.single_files.write_folder`, sharded
past 5 GiB), its ``config.json`` the base's with the run's architecture over it — and the rest
of the pipeline (``model_index.json``, VAE, text encoders, tokenizers, scheduler, a second
expert, ``ditax_sample.json``; not a recipe's ``manifest.json``, which lists the base's files) is
copied, or linked, from the base: the run's ``init_from``, or ``--base FOLDER``. The folder is
written hidden beside ``--out`` and renamed when complete.

Everything is checked before a weight is read, each a one-line :class:`ConfigError`: the run
folder (a ``ditax train`` run; a LoRA run is refused naming its adapter files, which already
are its export; a ``ditax train-vae`` run naming its VAE folder), a finished checkpoint and the
``--step`` asked, ``--out`` new or empty, and a base that is a pipeline folder of the run's
family and architecture. A partly frozen run (a VACE branch trained) whose checkpoints leave the
frozen base out takes it from ``init_from``, as its resume does.

``RUN_DIR`` may be a run at a URL (``ditax train ... output_dir=gs://...``): its
``config.yaml`` and the one checkpoint step exported are downloaded into this host's cache
(committed steps only, :mod:`ditax.io.remote.runs`). ``--out`` may be a URL: the folder is
written locally as for a local ``--out``, checked, then uploaded with ``model_index.json``
last (:mod:`ditax.io.remote.folders`); ``--link`` needs a local ``--out``; ``memory://``, whose
store dies with the command, is refused (:func:`ditax.io.remote.urls.resolve`). A write that
fails (the disk full) is :class:`~ditax.io.outputs.WriteFailed` naming ``--out``.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import shutil

from ditax.errors import ConfigError, ModelNotFound

MANIFEST = "manifest.json"     # ditax.recipes.common.MANIFEST


@dataclasses.dataclass(frozen=True)
class ExportPlan:
    """What :func:`export_run` writes, every input checked (:func:`plan_export`)."""

    run: pathlib.Path
    out: pathlib.Path
    step: int
    base: pathlib.Path          # the pipeline folder the other components come from
    cfg: object                 # the run's Config (its config.yaml)
    dtype: str | None
    link: bool
    run_url: str | None = None  # RUN_DIR as given when a URL (``run``: its local copy)
    out_url: str | None = None  # --out as given when a URL (``out``: the staging folder)
    steps: object = None        # a URL run's StepSync (fetches the step exported)


def _run_folder(run) -> pathlib.Path:
    from ditax.io.files import path_arg

    p = path_arg(run, "RUN_DIR", ConfigError, "the output_dir of a ditax train run")
    if not p.exists():
        raise ConfigError(f"RUN_DIR {run} does not exist; pass the output_dir of a ditax train "
                          f"run (the folder holding config.yaml and checkpoints/)")
    if not p.is_dir() or not (p / "config.yaml").is_file():
        what = "is a file" if not p.is_dir() else "has no config.yaml"
        raise ConfigError(f"RUN_DIR {run} {what}, so it is no training run; pass the "
                          f"output_dir of a ditax train run (config.yaml and checkpoints/)")
    return p


def _lora_refusal(run, cfg, names=None) -> str:
    """``names``: the files at the top of the run (a URL run's; None: listed here)."""
    from ditax.lora.export import ORIGINAL_FILE, PEFT_FILE

    if names is None:
        names = {f for f in (PEFT_FILE, ORIGINAL_FILE) if (pathlib.Path(run) / f).is_file()}
    files = [f"{str(run).rstrip('/')}/{f}" for f in (PEFT_FILE, ORIGINAL_FILE) if f in names]
    base = cfg.init_from or "its base model"
    if files:
        have = (f"its adapters are already written as LoRA files: {files[0]} (diffusers) and "
                f"{files[1]} (ComfyUI); use them with the base, e.g. ditax generate --model "
                f"{base} --lora {files[0]}") if len(files) == 2 else (
                f"its adapters are already written as {files[0]}; use it with the base "
                f"(--lora {files[0]})")
    else:
        have = ("its adapters are written as LoRA files (lora.safetensors, "
                "lora_comfyui.safetensors) when the run finishes or stops on a signal: rerun "
                "the same ditax train command to finish it")
    return (f"RUN_DIR {run} is a LoRA run (lora.rank={cfg.lora.rank}): {have}. ditax export "
            f"writes full fine-tunes; merging the adapters into a folder is not offered")


def plan_export(run, out, *, step: int | None = None, base=None, dtype: str | None = None,
                link: bool = False) -> ExportPlan:
    """Check every input of an export (nothing heavy is read: the run's config, the
    checkpoint folder names, the base's JSON files) and return the plan."""
    from ditax.config import load_config
    from ditax.io.files import path_arg, read_yaml
    from ditax.models import registry
    from ditax.models.common.single_files import check_out
    from ditax.train.checkpoint_read import finished_steps

    from ditax.io.remote.urls import resolve

    run_url = sync = names = None
    run = resolve(run, "RUN_DIR", error=ConfigError, output=False,
                  expected="the output_dir of a ditax train run")
    if isinstance(run, str):    # a run at a URL: read from a local copy (its config.yaml)
        from ditax.io.remote.folders import run_copy

        run_url = run
        copy, sync, names = run_copy(run_url, "RUN_DIR", ConfigError)
        if "config.yaml" not in names:
            raise ConfigError(f"RUN_DIR {run_url} has no config.yaml, so it is no training "
                              f"run; pass the output_dir of a ditax train run")
        run = copy
    run = _run_folder(run)
    shown = run_url or run          # what messages name
    saved = read_yaml(run / "config.yaml", what="the run's saved config",
                      fix="it records the run; restore it")
    if isinstance(saved, dict) and "model" not in saved and "vae" in saved:
        raise ConfigError(f"RUN_DIR {shown} is a VAE run (ditax train-vae): its VAE is "
                          f"written as a diffusers folder in {shown}/vae when it finishes; "
                          f"ditax export writes transformer runs")
    cfg = load_config(str(run / "config.yaml"), [])
    if cfg.lora.rank:
        raise ConfigError(_lora_refusal(shown, cfg, names))
    steps = sync.committed() if sync is not None else finished_steps(run / "checkpoints")
    if not steps:
        raise ConfigError(f"RUN_DIR {shown} holds no finished checkpoint in "
                          f"{str(shown).rstrip('/')}/checkpoints; train it further (a "
                          f"checkpoint is written every checkpoint.every steps and at the "
                          f"end), or pass another run")
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise ConfigError(f"--step {step}: {shown} has checkpoints at steps "
                          f"{', '.join(map(str, steps))}; pass one of them (default: the "
                          f"newest, {steps[-1]})")
    out_url = None
    out = resolve(out, "--out", error=ConfigError, expected="a new folder for the pipeline")
    if isinstance(out, str):    # a URL: written here, then uploaded (model_index.json last)
        from ditax.io.remote.folders import check_new_url, staging

        if link:
            raise ConfigError(f"--link links the base's files into --out, which a URL "
                              f"({out}) cannot hold; drop --link or give a local --out")
        out_url = out
        check_new_url(out_url, "--out", ConfigError)
        out = staging(out_url, "export-out")
        shutil.rmtree(out, ignore_errors=True)      # an earlier, unfinished try
    out = check_out(out, dtype)
    if base is not None:
        path_arg(base, "--base", ConfigError, "a pipeline folder or a hub id")
    name = cfg.model.family
    what = f"ditax export {shown}"
    for capability in ("init_from", "quantize", "folder_check"):
        registry.require(name, capability, what, "export a run of a family that has it")
    return ExportPlan(run, out, step, _base_folder(shown, cfg, base), cfg, dtype, link,
                      run_url=run_url, out_url=out_url, steps=sync)


def _base_folder(run, cfg, base) -> pathlib.Path:
    """The pipeline folder the other components come from (``--base`` or the run's
    ``init_from``), checked to be one of the run's family and architecture."""
    from ditax.models.base import model_family
    from ditax.pipelines.family import family_name, model_folder

    if base is None and not cfg.init_from:
        raise ConfigError(f"RUN_DIR {run} was trained without init_from, so it has no pipeline "
                          f"to take the VAE, text encoder, tokenizer and scheduler from; pass "
                          f"--base FOLDER (a {cfg.model.family} pipeline folder of the same "
                          f"transformer architecture)")
    flag = "--base" if base is not None else "the run's init_from"
    given = base if base is not None else cfg.init_from
    try:
        root = model_folder(given, flag)
    except ModelNotFound as e:
        if base is not None:
            raise
        raise ConfigError(f"{e}. The other components come from the run's init_from (its "
                          f"config.yaml): give them with --base FOLDER") from None
    theirs = family_name(root)
    if theirs != cfg.model.family:
        raise ConfigError(f"{flag} {given} is a {theirs} pipeline folder, but the run trained "
                          f"a {cfg.model.family} model; pass a {cfg.model.family} pipeline "
                          f"folder (--base FOLDER)")
    family = model_family(cfg.model, cfg.attention)
    try:
        family.weights_folder(root)
    except ConfigError as e:
        diff = ", ".join(f"{k}: run {getattr(cfg.model, k)} vs folder {v}"
                         for k, v in family.folder_config(root).items()
                         if getattr(cfg.model, k, v) != v) or str(e)
        raise ConfigError(f"{flag} {given}: its transformer is another architecture than the "
                          f"run's ({diff}); pass the pipeline folder the run was trained from "
                          f"(--base FOLDER)") from None
    return root


def _abstract_params(family):
    """The model's parameter tree (``ShapeDtypeStruct`` leaves) and a one-device mesh."""
    import jax
    from flax import nnx

    from ditax.parallel.mesh import make_mesh

    mesh = make_mesh(dict(data=1, fsdp=1, context=1, tensor=1), jax.devices()[:1])
    return nnx.to_pure_dict(nnx.split(family.abstract(mesh))[1]), mesh


def _fill(tree: dict, base: dict, missing: set, path=()) -> dict:
    """``tree`` with the leaves at the dotted paths ``missing`` taken from ``base``."""
    import numpy as np

    out = dict(tree)
    for k, v in base.items():
        here = path + (str(k),)
        if isinstance(v, dict):
            sub = _fill(tree.get(k, {}), v, missing, here)
            if sub:
                out[k] = sub
        elif ".".join(here) in missing:
            out[k] = np.asarray(v)
    return out


class _Tensors:
    """Converted tensors in memory, as :func:`~ditax.models.common.single_files.write_folder`
    reads them (``shape``, ``dtype``, ``get`` by key)."""

    def __init__(self, tensors: dict):
        self._t = tensors

    def shape(self, key):
        return tuple(self._t[key].shape)

    def dtype(self, key):
        return self._t[key].dtype

    def get(self, key):
        return self._t[key]


def _copy_component(src: pathlib.Path, dst: pathlib.Path, link: bool) -> None:
    if link:
        os.symlink(src.resolve(), dst, target_is_directory=src.is_dir())
    elif src.is_dir():
        shutil.copytree(src, dst)          # a hub cache's links are followed: real files
    else:
        shutil.copy2(src, dst)


def _student_settings(folder: pathlib.Path, cfg, family, say) -> None:
    """A few-step student's folder samples as it was trained: its scheduler config the
    student's sampler and shift, its ``ditax_sample.json`` the student's steps, guidance and
    sigmas over the base's (each written as a new file, never through a link to the base)."""
    import json

    from ditax.pipelines.family import pipelines_of
    from ditax.pipelines.sample_defaults import FILE
    from ditax.schedulers.overrides import override_config
    from ditax.train.distill import sample_settings

    settings = sample_settings(cfg, family, None)
    sched = folder / "scheduler" / "scheduler_config.json"
    if sched.exists() and ("scheduler" in settings or "flow_shift" in settings):
        config = override_config(json.loads(sched.read_text()), settings.get("scheduler"),
                                 settings.get("flow_shift"))
        if (folder / "scheduler").is_symlink():
            (folder / "scheduler").unlink()
            (folder / "scheduler").mkdir()
        sched.write_text(json.dumps(config, indent=2) + "\n")
    rules = pipelines_of(family.name).sample_file_rules()
    own = folder / FILE
    values = json.loads(own.read_text()) if own.exists() else {}
    values.update({k: v for k, v in settings.items() if k in rules})
    if own.is_symlink():
        own.unlink()
    own.write_text(json.dumps(values, indent=2) + "\n")
    say(f"a few-step student: its scheduler and {FILE} sample it as trained ("
        + ", ".join(f"{k}={v}" for k, v in settings.items()) + ")")


def export_run(plan: ExportPlan, say=print) -> pathlib.Path:
    """Write ``plan`` (:func:`plan_export`): the checkpoint's transformer and the base's other
    components, as one pipeline folder at ``plan.out``; returns it."""
    import numpy as np

    from ditax.io.convert import export
    from ditax.io.files import read_model_json
    from ditax.io.outputs import atomic_folder
    from ditax.models.base import model_family
    from ditax.models.common.single_files import write_folder
    from ditax.train.checkpoint_read import read_params

    cfg = plan.cfg
    family = model_family(cfg.model, cfg.attention)
    abstract, mesh = _abstract_params(family)
    if plan.steps is not None:          # a URL run: the step exported, downloaded
        plan.steps.fetch(plan.step, say)
    params, missing = read_params(plan.run / "checkpoints", plan.step, abstract)
    shown = plan.run_url or plan.run
    if missing:     # a partly frozen run: its frozen base is init_from's, as on resume
        if not cfg.init_from:
            raise ConfigError(f"checkpoint step {plan.step} of {shown} leaves out "
                              f"{len(missing)} frozen weights (e.g. {missing[0]}), built from "
                              f"the seed at training time; ditax export takes them only from "
                              f"init_from, which the run had none of")
        base = family.load_params(family.weights_folder(cfg.init_from), mesh)
        params = _fill(params, base, set(missing))
        del base
        say(f"the run's frozen weights ({len(missing)} tensors) taken from its init_from "
            f"{cfg.init_from}")
    tensors = export(family.weight_table(), params)
    del params
    tensors = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    config = {**read_model_json(plan.base / "transformer" / "config.json", "transformer config"),
              **family.model.to_diffusers()}
    # a recipe's manifest (sha256 of each file) would list the base's transformer: left out
    others = sorted(p for p in plan.base.iterdir() if p.name not in ("transformer", MANIFEST)
                    and not p.name.startswith("."))
    with atomic_folder(plan.out) as tmp:
        write_folder(tmp / "transformer", _Tensors(tensors), {k: k for k in tensors}, config,
                     dtype=plan.dtype)
        for src in others:
            _copy_component(src, tmp / src.name, plan.link)
        if cfg.distill.method != "none":
            _student_settings(tmp, cfg, family, say)
    how = "linked" if plan.link else "copied"
    checked = type(family).check_folder(plan.out / "transformer", None)
    if plan.out_url is not None:
        from ditax.io.remote.folders import upload_folder

        upload_folder(plan.out, plan.out_url, "model_index.json", ConfigError)
        shutil.rmtree(plan.out, ignore_errors=True)
    say(f"wrote {plan.out_url or plan.out}: transformer from checkpoint step {plan.step} of "
        f"{shown}; {', '.join(p.name for p in others)} {how} from {plan.base}")
    say(checked)
    return plan.out if plan.out_url is None else plan.out_url


__all__ = ["ExportPlan", "plan_export", "export_run"]
