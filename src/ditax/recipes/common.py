"""What the demo recipes share (:mod:`ditax.recipes.demo_model` for Wan,
:mod:`ditax.recipes.flux_demo_model` for Flux): the manifest of a shipped folder (every
file's sha256) and the stage runner (each stage timed into ``{out}/recipe.json``; a stage an
earlier run into the same ``out`` finished is kept)."""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import pathlib
import shutil
import time

MANIFEST = "manifest.json"


def sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_manifest(folder) -> dict:
    """``{relative path: sha256}`` of every file of ``folder`` (but the manifest itself)."""
    folder = pathlib.Path(folder)
    files = {str(p.relative_to(folder)): sha256(p) for p in sorted(folder.rglob("*"))
             if p.is_file() and p.name != MANIFEST}
    (folder / MANIFEST).write_text(json.dumps({"files": files}, indent=1))
    return files


def check_manifest(folder) -> list[str]:
    """Files of ``folder`` whose sha256 differs from (or is missing in) its manifest; [] = ok."""
    folder = pathlib.Path(folder)
    listed = json.loads((folder / MANIFEST).read_text())["files"]
    bad = [name for name, digest in listed.items()
           if not (folder / name).is_file() or sha256(folder / name) != digest]
    extra = [str(p.relative_to(folder)) for p in folder.rglob("*")
             if p.is_file() and p.name != MANIFEST and str(p.relative_to(folder)) not in listed]
    return sorted(bad + extra)


class StagedRecipe:
    """One run of a recipe into ``out`` (work files) and ``folder`` (the pipeline). A
    subclass names its stages (methods, in order) in ``STAGES``, the file each one leaves
    when finished in ``MARKERS`` (stages without a marker always run), its log prefix in
    ``NAME``. ``train_devices``: how many devices (the first ones) the ``ditax train`` stages
    (transformer, distillation) run on; None: all of them (``mesh.fsdp=-1``)."""

    NAME = "recipe"
    STAGES: tuple[str, ...] = ()
    MARKERS: dict[str, str] = {}

    def __init__(self, out, sizes, *, seed: int = 0, folder=None, devices: int = 1,
                 train_devices: int | None = None, say=print, progress: bool = True):
        self.out = pathlib.Path(out)
        self.train_devices = train_devices
        self.folder = pathlib.Path(folder) if folder else self.out / "pipeline"
        self.sizes = sizes
        self.seed = seed
        self.devices = devices
        self.say = say
        self.progress = progress
        self.record: dict = {"sizes": dataclasses.asdict(sizes), "seed": seed, "stages": {}}

    def _stage(self, name: str, fn):
        t0 = time.perf_counter()
        self.say(f"== {self.NAME}: {name}")
        info = fn() or {}
        wall = time.perf_counter() - t0
        self.record["stages"][name] = {"seconds": round(wall, 1), **info}
        self.say(f"== {self.NAME}: {name} done in {wall:.0f} s {info if info else ''}")
        (self.out / "recipe.json").write_text(json.dumps(self.record, indent=1))

    def train_mesh(self, cfg):
        """The mesh of a ``ditax train`` stage of config ``cfg``: None (``cfg.mesh`` over every
        device) or, with ``train_devices``, ``cfg.mesh`` over that many."""
        if self.train_devices is None:
            return None
        import jax

        from ditax.parallel.mesh import make_mesh

        return make_mesh(cfg.mesh, jax.devices()[:self.train_devices])

    def transformer_args(self, frames: int, height: int, width: int, log_every: int) -> list[str]:
        """The ``ditax train`` overrides of the transformer stage every recipe shares: flow
        matching from random weights on the recipe's latents (``frames x height x width``) with
        its sizes (steps, batch, cosine learning rate, text dropout, the flow shift), into
        ``out/transformer``; the family's model and flow keys come with them."""
        s = self.sizes
        return ["mesh.fsdp=-1", f"data.source={self.out / 'latents'}",
                f"data.num_frames={frames}", f"data.height={height}", f"data.width={width}",
                f"data.text_len={s.text_len}", f"data.text_dropout={s.text_dropout}",
                f"steps={s.transformer_steps}", f"batch_size={s.transformer_batch}",
                f"seed={self.seed}", f"optim.learning_rate={s.transformer_lr}",
                f"optim.warmup_steps={min(50, s.transformer_steps // 4)}",
                "optim.schedule=cosine", "optim.weight_decay=0.0", f"log_every={log_every}",
                f"checkpoint.every={s.checkpoint_every}",
                f"output_dir={self.out / 'transformer'}", f"flow.shift={s.flow_shift}"]

    def train_transformer(self, cfg, title: str) -> dict:
        """``ditax train`` of config ``cfg`` (the transformer stage); its parameters are kept
        for the folder, its summary (:func:`transformer_summary`) is the stage's record."""
        from ditax.train.loop import train

        res = train(cfg, mesh=self.train_mesh(cfg), progress=self.progress, say=self.say)
        self._transformer_params = res.state["params"]
        return transformer_summary(self.out / "transformer", title)

    def finish_folder(self, folder, stages) -> dict:
        """``folder``'s manifest (:func:`write_manifest`), and the loss curve of each of
        ``stages`` copied beside the work files (``out/loss_{stage}.png``); the stage's record
        (the folder, its bytes and files)."""
        folder = pathlib.Path(folder)
        files = write_manifest(folder)
        size = sum((folder / n).stat().st_size for n in files)
        for stage in stages:
            png = self.out / stage / "loss.png"
            if png.is_file():
                shutil.copy(png, self.out / f"loss_{stage}.png")
        return {"folder": str(folder), "bytes": size, "files": len(files)}

    def done(self, name: str) -> bool:
        """Whether stage ``name`` finished in an earlier run into the same ``out``."""
        return name in self.MARKERS and (self.out / self.MARKERS[name]).is_file()

    def run(self, stages=None) -> dict:
        """Run ``stages`` (default all) in order; a stage an earlier run into ``out`` finished
        is kept (a training stage resumes from its checkpoints)."""
        self.out.mkdir(parents=True, exist_ok=True)
        prev = self.out / "recipe.json"
        if prev.is_file():
            self.record["stages"] = json.loads(prev.read_text()).get("stages", {})
        for name in stages or self.STAGES:
            if self.done(name) and name in self.record["stages"]:
                self.say(f"== {self.NAME}: {name} already done in {self.out}; kept")
                continue
            self._stage(name, getattr(self, name))
        self.record["seconds"] = round(sum(v["seconds"] for v in
                                           self.record["stages"].values()), 1)
        (self.out / "recipe.json").write_text(json.dumps(self.record, indent=1))
        self.say(f"{self.NAME}: done in {self.record['seconds'] / 60:.1f} min; pipeline folder "
                 f"{self.folder}")
        return self.record


def transformer_summary(folder, title: str) -> dict:
    """``folder/loss.png`` from ``folder/metrics.jsonl`` and the stage's record: the first,
    last and mean of the last 10 logged losses (every ``log_every`` steps, so a resumed or
    finished run reports too)."""
    from ditax.train.plots import loss_curve, read_metrics

    metrics = pathlib.Path(folder) / "metrics.jsonl"
    loss_curve(metrics, pathlib.Path(folder) / "loss.png", title=title, keys=("loss",),
               smooth=10)
    losses = [r["loss"] for r in read_metrics(metrics) if "loss" in r]
    return {"first_loss": losses[0], "last_loss": losses[-1],
            "mean_last_10_logged": sum(losses[-10:]) / len(losses[-10:])}


def recipe_main(argv, recipe: type[StagedRecipe], sizes: dict, *, prog: str, description: str,
                default_out: str) -> int:
    """The command line of a recipe module (``python -m ditax.recipes.NAME``): ``--out``,
    ``--folder``, ``--sizes`` (a key of ``sizes``), ``--seed``, ``--devices``, ``--stages``,
    ``--no-progress``."""
    stages_all = recipe.STAGES
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--out", default=default_out, help=f"work folder (default {default_out}/)")
    p.add_argument("--folder", default=None, help="pipeline folder (default OUT/pipeline)")
    p.add_argument("--sizes", default="full", choices=sorted(sizes))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--devices", type=int, default=1,
                   help="devices (XLA_FLAGS host device count when unset): the VAE trains "
                   "data-parallel on this many, the transformer on all")
    p.add_argument("--train-devices", type=int, default=None,
                   help="devices the transformer / student trains on (default all)")
    p.add_argument("--stages", default=",".join(stages_all),
                   help="comma list of stages to run (finished ones in OUT are kept)")
    p.add_argument("--no-progress", action="store_true")
    a = p.parse_args(argv)
    stages = [x for x in a.stages.split(",") if x]
    bad = [x for x in stages if x not in stages_all]
    if bad:
        p.error(f"--stages: unknown {bad}; stages are {', '.join(stages_all)}")
    os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={a.devices}")
    recipe(a.out, sizes[a.sizes], seed=a.seed, folder=a.folder, devices=a.devices,
           train_devices=a.train_devices, progress=not a.no_progress).run(stages)
    return 0


@dataclasses.dataclass(frozen=True)
class StudentSizes:
    """The sizes every student recipe has (:meth:`StudentRecipe.distill_args` reads them); a
    recipe's ``Sizes`` adds its data and score sizes."""

    text_len: int                # text tokens (the teacher's)
    student_steps: int           # distill.steps: the student's Euler steps
    shift: float                 # distill.shift (0: the family's training shift)
    guidance: float              # distill.guidance: the teacher's CFG scale (1 = none)
    rank: int                    # lora.rank (alpha = rank)
    steps: int                   # student updates
    batch: int
    lr: float
    critic_lr: float             # distill.critic_learning_rate (0: lr)
    critic_updates: int
    warmup: int
    checkpoint_every: int
    score_seeds: tuple           # noise seeds of the score (never drawn by the training)


class StudentRecipe(StagedRecipe):
    """A few-step student's recipe (stages data, distill, score, ship) into ``out`` (work
    files) and ``folder`` (the shipped student, default ``out/student``); ``teacher``: the
    teacher's pipeline folder (default :meth:`default_teacher`). A subclass sets ``NAME``,
    ``WHAT`` (the loss curve's title), ``TEACHER``, ``distill_config``, ``ship_files`` and
    the stages ``data`` and ``score``; its sizes are a :class:`StudentSizes`."""

    STAGES = ("data", "distill", "score", "ship")
    MARKERS = {"data": "latents/meta.json", "distill": "distill/lora.safetensors",
               "score": "score.json"}
    WHAT = "student (DMD2 loss)"

    #: the :mod:`ditax.demo` function whose shipped folder is the default teacher
    TEACHER = "model_path"

    def __init__(self, out, sizes, *, teacher=None, **kw):
        super().__init__(out, sizes, **kw)
        if kw.get("folder") is None:
            self.folder = self.out / "student"
        self.teacher = pathlib.Path(teacher) if teacher else self.default_teacher()
        self.record["teacher"] = str(self.teacher)

    def default_teacher(self) -> pathlib.Path:
        """The shipped teacher (:data:`TEACHER`)."""
        import ditax.demo

        return getattr(ditax.demo, self.TEACHER)()

    def distill_config(self):
        raise NotImplementedError

    def distill_args(self, frames: int, height: int, width: int, log_every: int) -> list[str]:
        """The ``ditax train`` overrides every student's distillation shares: from the teacher
        (``init_from``) on the recipe's latents (``frames x height x width``, no text dropout),
        DMD2 with the recipe's sizes, a LoRA on attention and FFN, a constant learning rate,
        one checkpoint kept, into ``out/distill``; the family's model, flow and further
        ``distill.*`` keys come with them."""
        s = self.sizes
        return ["mesh.fsdp=-1", f"init_from={self.teacher}",
                f"data.source={self.out / 'latents'}", f"data.num_frames={frames}",
                f"data.height={height}", f"data.width={width}", f"data.text_len={s.text_len}",
                "data.text_dropout=0.0",
                "distill.method=dmd2", f"distill.steps={s.student_steps}",
                f"distill.shift={s.shift}", f"distill.guidance={s.guidance}",
                f"distill.critic_updates={s.critic_updates}",
                f"distill.critic_learning_rate={s.critic_lr}",
                f"lora.rank={s.rank}", "lora.targets=attn,ffn",
                f"steps={s.steps}", f"batch_size={s.batch}", f"seed={self.seed}",
                f"optim.learning_rate={s.lr}", f"optim.warmup_steps={s.warmup}",
                "optim.schedule=constant", "optim.weight_decay=0.0", f"log_every={log_every}",
                f"checkpoint.every={s.checkpoint_every}", "checkpoint.keep=1",
                f"output_dir={self.out / 'distill'}"]

    def ship_files(self, folder: pathlib.Path) -> None:
        """Write the student's files into the (new, empty) ship ``folder``."""
        raise NotImplementedError

    def ship(self):
        """The ship folder, new: the student's files (:meth:`ship_files`) and its manifest."""
        f = self.folder
        if f.exists():
            shutil.rmtree(f)
        f.mkdir(parents=True)
        self.ship_files(f)
        return self.finish_folder(f, ("distill",))

    def distill(self):
        """``ditax train`` of :meth:`distill_config`; its summary, last critic loss and the
        student's sampling settings (``distill/ditax_sample.json``, written with its LoRA)."""
        from ditax.train.loop import train
        from ditax.train.plots import read_metrics

        out = self.out / "distill"
        cfg = self.distill_config()
        train(cfg, mesh=self.train_mesh(cfg), progress=self.progress, say=self.say)
        info = transformer_summary(out, self.WHAT)
        critic = [r["critic_loss"] for r in read_metrics(out / "metrics.jsonl")
                  if "critic_loss" in r]
        return {**info, "last_critic_loss": critic[-1] if critic else None,
                "sample": json.loads((out / "ditax_sample.json").read_text())}


__all__ = ["MANIFEST", "StagedRecipe", "StudentRecipe", "StudentSizes", "check_manifest",
           "recipe_main", "sha256", "transformer_summary", "write_manifest"]
