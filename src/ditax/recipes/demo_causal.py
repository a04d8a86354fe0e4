"""``make demo-causal``: the demo model's causal student (issue 59), distilled with ditax's
own tools: Self-Forcing (``distill.method=self_forcing``) of the shipped demo model into a
block-causal 4-step student that makes a video chunk by chunk of ``CHUNK`` latent frames
against a KV cache, and so runs past the teacher's 17 frames.

Stages (each timed; the run's record is ``{out}/recipe.json``):

1. **data** — as :mod:`ditax.recipes.demo_student`'s: synthetic clips of the seen
   combinations, encoded with the teacher's VAE and UMT5 (DMD reads the prompts' text
   embeddings, the empty prompt's and the latents' shape).
2. **distill** — ``ditax train`` with ``init_from=TEACHER distill.method=self_forcing
   model.causal_chunk=1 distill.steps=4 distill.guidance=8 sample.context_chunks=C``: the
   whole student (no LoRA) starts as the teacher's weights run block-causal and trains on its
   own chunk-by-chunk rollouts against the guided teacher.
3. **export** — ``ditax export`` of the run (:func:`ditax.train.export.export_run`) into the
   ship folder (``--folder``; default ``OUT/student``; ``src/ditax/assets/demo_causal`` is
   the shipped one): its transformer (``causal_chunk`` in its config.json, bfloat16 as the
   teacher's), scheduler (Euler, the student's shift) and ``ditax_sample.json`` (steps,
   sigmas, ``context_chunks``, the teacher's size); the tokenizer, text encoder and VAE are
   the teacher's, linked relatively (``../demo_model/vae`` beside the shipped demo model,
   nothing copied) + ``manifest.json`` of the student's own files. Shipping it: ``python -m
   ditax.recipes.demo_causal --out demo_causal --folder src/ditax/assets/demo_causal``
   (after ``make demo-causal`` the data and the distillation are kept; export and score
   always run).
4. **score** — the demo scorer (:mod:`ditax.synthetic.score`) per window of the teacher's
   length (:func:`ditax.demo.causal.window_scores`): the teacher at 1x as
   :data:`ditax.demo.SAMPLE` says, the student at 1x and ``LONG``x the teacher's frames,
   over every combination x :attr:`Sizes.score_seeds`; ``OUT/score.json`` (every window) and
   the ship folder's ``score.json`` (the shares, times to the first frame, frames per second).

``FULL`` is the shipped student (``python -m ditax.recipes.demo_causal``); ``SMOKE`` the same
recipe at toy sizes (tests).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil

from ditax.recipes.common import recipe_main, write_manifest
from ditax.recipes.demo_student import Recipe as StudentRecipe
from ditax.recipes.demo_student import Sizes as StudentSizes

CHUNK = 1           # latent frames per chunk: 17 frames = 5 latent frames = 5 chunks
LONG = 4            # the long video: this many times the teacher's latent frames
SCORE_FILE = "score.json"
LINKED = ("tokenizer", "text_encoder", "vae")   # the teacher's, linked


@dataclasses.dataclass(frozen=True)
class Sizes(StudentSizes):
    """The student recipe's sizes (``rank`` unused: the whole student trains) and the KV
    cache's window beside the sink."""

    context_chunks: int = 3
    long_chunks: int = 0        # the long stage's rollout in chunks (distill.rollout_chunks)
    long_steps: int = 0         # the long stage's steps (0: no long stage)


FULL = Sizes(clips=70, paraphrase_fraction=0.3, height=64, width=64, frames=17, text_len=16,
             student_steps=4, shift=5.0, guidance=8.0, rank=0, steps=200, batch=4, lr=1e-4,
             critic_lr=0.0, critic_updates=2, warmup=10, remat="none", checkpoint_every=50,
             score_seeds=(1000,), score_combos=0, teacher_steps=25, context_chunks=3,
             long_chunks=LONG * 5, long_steps=200)   # 5 = the teacher's 17 frames, latent
SMOKE = dataclasses.replace(
    FULL, clips=8, height=32, width=32, frames=5, steps=1, batch=8, critic_updates=1,
    warmup=0, checkpoint_every=1, score_seeds=(1000,), score_combos=2, teacher_steps=2,
    context_chunks=1, long_chunks=4, long_steps=1)
SIZES = {"full": FULL, "smoke": SMOKE}


class Recipe(StudentRecipe):
    """One run into ``out`` (work files) and ``folder`` (the shipped causal student)."""

    NAME = "demo-causal"
    WHAT = "demo causal student (Self-Forcing DMD loss)"
    STAGES = ("data", "distill", "long", "export", "score")
    MARKERS = {"data": "latents/meta.json", "distill": "distill/ditax_sample.json",
               "long": "distill/long.json"}
    _long = False       # distill_args of the long stage

    def distill_args(self, frames, height, width, log_every):
        s = self.sizes
        drop = ("distill.method=", "lora.") + (("steps=",) if self._long else ())
        more = [f"steps={s.steps + s.long_steps}",
                f"distill.rollout_chunks={s.long_chunks}"] if self._long else []
        return [a for a in super().distill_args(frames, height, width, log_every)
                if not a.startswith(drop)] + [
            "distill.method=self_forcing", f"model.causal_chunk={CHUNK}", "lora.rank=0",
            f"sample.context_chunks={s.context_chunks}", "checkpoint.keep=1"] + more

    def long(self):
        """The distill stage's run resumed with long rollouts (module docstring, stage 2b)."""
        from ditax.train.loop import train
        from ditax.train.plots import read_metrics

        s = self.sizes
        if not s.long_steps:
            return {"steps": 0}
        self._long = True
        try:
            cfg = self.distill_config()
        finally:
            self._long = False
        train(cfg, mesh=self.train_mesh(cfg), progress=self.progress, say=self.say)
        out = self.out / "distill"
        losses = [r["loss"] for r in read_metrics(out / "metrics.jsonl")
                  if "loss" in r and r["step"] > s.steps]      # this stage's steps
        info = {"steps": s.long_steps, "rollout_chunks": s.long_chunks,
                "first_loss": losses[0], "last_loss": losses[-1],
                "mean_last_10_logged": sum(losses[-10:]) / len(losses[-10:])}
        (out / "long.json").write_text(json.dumps(info, indent=1) + "\n")
        return info

    def export(self):
        """The run as a pipeline folder (module docstring, stage 3)."""
        from ditax.train.export import export_run, plan_export

        f = self.folder
        if f.exists():
            shutil.rmtree(f)
        plan = plan_export(self.out / "distill", f, base=self.teacher, dtype="bfloat16",
                           link=True)
        export_run(plan, say=self.say)
        link_teacher_parts(f, self.teacher)
        for p in f.rglob("*"):
            if p.is_file() and not p.is_symlink():
                p.chmod(0o644)          # not the checkpoint's 0600
        sample = json.loads((f / "ditax_sample.json").read_text())
        files = write_manifest_own(f)
        png = self.out / "distill" / "loss.png"
        if png.is_file():
            shutil.copy(png, self.out / "loss_distill.png")
        return {"folder": str(f), "bytes": sum((f / n).stat().st_size for n in files),
                "files": len(files), "sample": sample}

    def score(self):
        from ditax.demo.causal import score_causal

        s = self.sizes
        combos = _combos(s.score_combos)
        res = score_causal(self.folder, self.teacher, [c.prompt for c in combos],
                           s.score_seeds, long=LONG, teacher_steps=s.teacher_steps,
                           say=self.say)
        (self.out / SCORE_FILE).write_text(json.dumps(res, indent=1) + "\n")
        kinds = ("teacher", "causal", "causal_long")
        short = {**{k: v for k, v in res.items() if k not in kinds},
                 **{k: {n: v for n, v in res[k].items() if n != "rows"} for k in kinds}}
        (self.folder / SCORE_FILE).write_text(json.dumps(short, indent=1) + "\n")
        write_manifest_own(self.folder)
        return short


def _combos(n):
    from ditax.recipes.demo_student import score_combinations

    return score_combinations(n)


def link_teacher_parts(folder, teacher) -> None:
    """``folder``'s :data:`LINKED` parts and ``model_index.json`` as links relative to
    ``teacher`` (the shipped student points at the shipped demo model beside it)."""
    folder, teacher = pathlib.Path(folder), pathlib.Path(teacher).resolve()
    for name in LINKED + ("model_index.json",):
        p = folder / name
        if p.is_symlink() or p.exists():
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
        p.symlink_to(os.path.relpath(teacher / name, folder.resolve()),
                     target_is_directory=(teacher / name).is_dir())


def write_manifest_own(folder) -> dict:
    """The manifest of ``folder``'s own files (not through its links to the teacher)."""
    folder = pathlib.Path(folder)
    own = {p.name for p in folder.iterdir() if not p.is_symlink()}
    files = {k: v for k, v in write_manifest(folder).items() if k.split("/")[0] in own}
    (folder / "manifest.json").write_text(json.dumps({"files": files}, indent=1))
    return files


def main(argv=None) -> int:
    """The recipe's command line (:func:`~ditax.recipes.common.recipe_main`); ``--folder
    src/ditax/assets/demo_causal`` ships the student."""
    return recipe_main(argv, Recipe, SIZES, prog="python -m ditax.recipes.demo_causal",
                       description=__doc__.split("\n\n")[0], default_out="demo_causal")


if __name__ == "__main__":
    raise SystemExit(main())
