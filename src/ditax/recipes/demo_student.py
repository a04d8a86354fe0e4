"""``make demo-student``: the demo model's 4-step student, distilled with ditax's own tools.

The teacher is the shipped demo model (:func:`ditax.demo.model_path`: sampled with UniPC, 25
steps, classifier-free guidance 8). The student is a LoRA on it, trained by DMD2
(:mod:`ditax.train.distill`) to sample in 4 Euler steps without guidance.

Stages (each timed; the run's record is ``{out}/recipe.json``):

1. **data** — synthetic clips (:mod:`ditax.synthetic`) of the seen combinations only (the
   held-out ones stay out, as for the teacher), encoded by ``ditax preprocess`` with the
   teacher's VAE and UMT5: DMD2 reads the prompts' text embeddings, the empty prompt's (the
   teacher's unconditional branch) and the latents' shape.
2. **distill** — ``ditax train`` with ``init_from=TEACHER distill.method=dmd2
   distill.guidance=8 lora.rank=R``; the run's folder gets ``lora.safetensors`` and
   ``ditax_sample.json`` (how the student samples).
3. **score** — the demo scorer (:mod:`ditax.synthetic.score`) on every combination x
   :attr:`Sizes.score_seeds` (seeds the training never drew): the teacher as
   :data:`ditax.demo.SAMPLE` says vs the student in 4 steps without guidance, seen and
   held-out combinations apart, with the seconds per video of each.
4. **ship** — ``lora.safetensors`` + ``ditax_sample.json`` + ``score.json`` + ``manifest.json``
   (every file's sha256) into the ship folder (``--folder``; default ``OUT/student``;
   ``src/ditax/assets/demo_student`` is the shipped one).

``FULL`` is the shipped student (``python -m ditax.recipes.demo_student``); ``SMOKE`` the same
recipe at toy sizes (tests). The runs that chose the settings are in
``docs/demo_student/choices.md``.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import statistics
import time
from dataclasses import dataclass

from ditax.recipes.common import (MANIFEST, StudentRecipe, StudentSizes,  # noqa: F401
                                  check_manifest, recipe_main)

LORA_FILE = "lora.safetensors"
SAMPLE_FILE = "ditax_sample.json"
SCORE_FILE = "score.json"
ATTRIBUTES = ("colour", "shape", "direction")
PHASES = ("text", "denoise", "decode")      # of a pipeline call (pipe.timings)


@dataclass(frozen=True)
class Sizes(StudentSizes):
    """Everything that sets the cost (and the result) of the recipe: the student's sizes
    (guidance: the teacher's SAMPLE's) and these."""

    clips: int                   # training clips (their prompts and latents; seen combinations)
    paraphrase_fraction: float   # share of paraphrased captions (as the teacher's data)
    height: int
    width: int
    frames: int
    remat: str                   # model.remat of the training step
    score_combos: int            # combinations scored (0: all 40; else the first n seen and
                                 # the first held-out one)
    teacher_steps: int           # the teacher's steps in the score (its SAMPLE's)


FULL = Sizes(clips=280, paraphrase_fraction=0.3, height=64, width=64, frames=17, text_len=16,
             student_steps=4, shift=5.0, guidance=8.0, rank=32, steps=300, batch=4, lr=5e-4,
             critic_lr=0.0, critic_updates=3, warmup=10, remat="none", checkpoint_every=100,
             score_seeds=(1000, 1001, 1002), score_combos=0, teacher_steps=25)
SMOKE = dataclasses.replace(
    # batch 8: one sample per device of 8 devices (mesh.fsdp=-1), or all on fewer
    FULL, clips=8, height=32, width=32, frames=5, rank=4, steps=1, batch=8, critic_updates=1,
    warmup=0, checkpoint_every=1, score_seeds=(1000,), score_combos=2, teacher_steps=2)
SIZES = {"full": FULL, "smoke": SMOKE}

STAGES = StudentRecipe.STAGES


def score_combinations(n: int = 0):
    """The combinations scored: all 40 (``n`` 0), else the first ``n - 1`` seen ones and the
    first held-out one."""
    from ditax.synthetic.vocab import HELD_OUT, all_combinations, is_held_out

    combos = all_combinations()
    if not n:
        return combos
    return [c for c in combos if not is_held_out(c)][:max(n - 1, 1)] + [HELD_OUT[0]]


def summarise(rows: list[dict]) -> dict:
    """Per split (``seen`` / ``held_out``) and per seed: videos and the share right of each
    attribute; the median seconds per video (of calls after a compiling one) and of each of
    its :data:`PHASES`."""
    out = {}
    for split, held in (("seen", False), ("held_out", True)):
        sel = [r for r in rows if r["held_out"] == held]
        if not sel:
            continue
        acc = {k: round(sum(r[f"{k}_correct"] for r in sel) / len(sel), 4) for k in ATTRIBUTES}
        seeds = sorted({r["seed"] for r in sel})
        per_seed = {str(s): {k: round(sum(r[f"{k}_correct"] for r in sel if r["seed"] == s)
                                      / sum(1 for r in sel if r["seed"] == s), 4)
                             for k in ATTRIBUTES} for s in seeds}
        out[split] = {"videos": len(sel), **acc, "per_seed": per_seed}
    out["median_seconds_per_video"] = round(statistics.median(r["seconds"] for r in rows), 3)
    out["median_seconds"] = {k: round(statistics.median(r[k] for r in rows), 3) for k in PHASES
                             if all(k in r for r in rows)}
    return out


def score_pipeline(pipe, call: dict, combos, seeds, say=print, tag: str = "") -> dict:
    """Each combination's canonical prompt x each seed through ``pipe(prompt, seed=s,
    **call)`` (compiled: call it once before), scored (:func:`ditax.synthetic.score.score`);
    ``{"rows", "summary"}``."""
    from ditax.synthetic.score import score
    from ditax.synthetic.vocab import is_held_out

    rows = []
    for combo in combos:
        for seed in seeds:
            t0 = time.perf_counter()
            video = pipe(combo.prompt, seed=seed, progress=False, **call)
            dt = time.perf_counter() - t0
            s = score(video, combo.prompt)
            rows.append({"prompt": combo.prompt, "seed": seed, "held_out": is_held_out(combo),
                         "seconds": round(dt, 3),
                         **{k: round(getattr(pipe.timings, k), 3) for k in PHASES},
                         "transformer_calls": pipe.last_stats.get("transformer_calls"),
                         **{k: s[k] for k in ("colour_correct", "shape_correct",
                                              "direction_correct", "colour", "shape",
                                              "direction")}})
    summary = summarise(rows)
    say(f"  {tag}: " + "; ".join(
        f"{split} colour {summary[split]['colour']:.1%} direction "
        f"{summary[split]['direction']:.1%}" for split in ("seen", "held_out")
        if split in summary) + f"; {summary['median_seconds_per_video']:.3f} s/video")
    return {"rows": rows, "summary": summary}


class Recipe(StudentRecipe):
    """One run of the recipe into ``out`` (work files) and ``folder`` (the shipped student).
    ``teacher``: the teacher's pipeline folder (default the shipped demo model)."""

    NAME = "demo-student"
    WHAT = "demo student (DMD2 loss)"
    TEACHER = "model_path"

    # --- the student's settings (what the distillation wrote; before it: what it will write)
    def sample_settings(self) -> dict:
        """The student's sampling settings: ``distill/ditax_sample.json`` when the run wrote
        it, else those of the run's config (:func:`ditax.train.distill.sample_settings`)."""
        written = self.out / "distill" / SAMPLE_FILE
        if written.is_file():
            return json.loads(written.read_text())
        from ditax.models.base import model_family
        from ditax.train.distill import sample_settings

        cfg = self.distill_config()
        s = self.sizes
        vae = json.loads((self.teacher / "vae" / "config.json").read_text())
        ft, fs = vae.get("scale_factor_temporal", 4), vae.get("scale_factor_spatial", 8)
        latent = (vae["z_dim"], (s.frames - 1) // ft + 1, s.height // fs, s.width // fs)
        family = model_family(cfg.model, cfg.attention, cfg.flow)
        return sample_settings(cfg, family, latent)

    # --- stages
    def data(self):
        from ditax.synthetic.clips import write_dataset
        from ditax.train.preprocess import preprocess

        s = self.sizes
        clips = self.out / "clips"
        if clips.exists():
            shutil.rmtree(clips)
        if (self.out / "latents").exists():
            shutil.rmtree(self.out / "latents")
        write_dataset(clips, s.clips, self.seed + 7, height=s.height, width=s.width,
                      num_frames=s.frames, paraphrase_fraction=s.paraphrase_fraction)
        lines = []
        preprocess(clips, self.out / "latents", self.teacher, height=s.height, width=s.width,
                   frames=s.frames, text_len=s.text_len, batch=8, say=lines.append)
        return {"clips": s.clips}

    def distill_config(self):
        from ditax.config import load_config

        s = self.sizes
        t = json.loads((self.teacher / "transformer" / "config.json").read_text())
        over = {f"model.{k}": v for k, v in t.items()
                if not k.startswith("_") and k not in ("image_dim", "added_kv_proj_dim",
                                                        "pos_embed_seq_len")}
        teacher_shift = json.loads((self.teacher / "scheduler" / "scheduler_config.json")
                                   .read_text()).get("flow_shift", 3.0)
        args = [f"{k}={json.dumps(v) if isinstance(v, (list, tuple)) else v}"
                for k, v in over.items()]
        return load_config("tiny", args + self.distill_args(s.frames, s.height, s.width, 5) + [
            # the critic's noise levels: the teacher's training shift (uniform, then shifted)
            "flow.timestep_sampler=uniform", f"flow.shift={teacher_shift}",
            f"model.remat={s.remat}"])

    def student_pipeline(self, lora=None):
        """The teacher's folder with the student's LoRA (``lora``: default the run's) and its
        load settings (scheduler, flow shift) from the student's sampling settings."""
        from ditax.pipelines.wan.loading import load_pipeline

        st = self.sample_settings()
        return load_pipeline(self.teacher, loras=[(str(lora or self.out / "distill" /
                                                       LORA_FILE), 1.0)],
                             **student_load(st))

    def score(self):
        from ditax.pipelines.wan.loading import load_pipeline
        from ditax.pipelines.sample_defaults import CALL_KEYS, read_sample_defaults

        s = self.sizes
        combos = score_combinations(s.score_combos)
        size = dict(height=s.height, width=s.width, num_frames=s.frames)
        teacher_call = {k: v for k, v in read_sample_defaults(self.teacher).items()
                        if k in CALL_KEYS}
        teacher_call.update(size, num_inference_steps=s.teacher_steps)
        student_call = {**student_call_args(self.sample_settings()), **size}
        res = {}
        for who, pipe, call in (("teacher", load_pipeline(self.teacher), teacher_call),
                                ("student", self.student_pipeline(), student_call)):
            pipe(combos[0].prompt, seed=s.score_seeds[0], progress=False, **call)   # compile
            res[who] = {"call": call, **score_pipeline(pipe, call, combos, s.score_seeds,
                                                       say=self.say, tag=who)}
        (self.out / SCORE_FILE).write_text(json.dumps(res, indent=1))
        t, st = res["teacher"]["summary"], res["student"]["summary"]
        return {"teacher": {k: v for k, v in t.items()},
                "student": {k: v for k, v in st.items()},
                "speedup": round(t["median_seconds_per_video"] /
                                 st["median_seconds_per_video"], 2)}

    def ship_files(self, f):
        shutil.copyfile(self.out / "distill" / LORA_FILE, f / LORA_FILE)   # not its 0600 mode
        (f / SAMPLE_FILE).write_text(json.dumps(self.sample_settings(), indent=2) + "\n")
        scores = json.loads((self.out / SCORE_FILE).read_text())
        (f / SCORE_FILE).write_text(json.dumps(
            {who: {"call": v["call"], "summary": v["summary"]} for who, v in scores.items()},
            indent=1) + "\n")


def student_load(settings: dict) -> dict:
    """The loader's arguments among a student's sampling settings (``scheduler``,
    ``flow_shift``)."""
    from ditax.pipelines.lora_sample import LOAD_KEYS

    return {k: v for k, v in settings.items() if k in LOAD_KEYS}


def student_call_args(settings: dict) -> dict:
    """The pipeline call's arguments among a student's sampling settings (steps, guidance,
    sigmas)."""
    from ditax.pipelines.lora_sample import LOAD_KEYS

    return {k: v for k, v in settings.items() if k not in LOAD_KEYS}


def main(argv=None) -> int:
    return recipe_main(argv, Recipe, SIZES, prog="python -m ditax.recipes.demo_student",
                       description=__doc__.split("\n\n")[0], default_out="demo_student")


if __name__ == "__main__":
    raise SystemExit(main())
