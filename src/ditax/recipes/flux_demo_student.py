"""``make flux-demo-student``: the small Flux's 4-step student, distilled with ditax's own tools.

The teacher is the shipped small Flux (:func:`ditax.demo.flux_model_path`: Euler, 20 steps,
shift 3, embedded guidance 3.5, no true CFG: :data:`ditax.demo.FLUX_SAMPLE`). The student is
a LoRA on it, trained by DMD2 (:mod:`ditax.train.distill`) to sample in 4 Euler steps.

Stages (each timed; the run's record is ``{out}/recipe.json``):

1. **data** — still images of the seen combinations (:mod:`ditax.synthetic.images`, the
   held-out ones left out as for the teacher), encoded by ``ditax preprocess`` with the
   teacher's VAE, CLIP and T5: DMD2 reads the prompts' embeddings and pooled vectors, the empty
   prompt's (the teacher's unconditional branch) and the latents' shape.
2. **distill** — ``ditax train`` with ``init_from=TEACHER distill.method=dmd2 lora.rank=R``
   (critic noise levels: the teacher's training flow, uniform then shift 3); the run's folder
   gets ``lora.safetensors`` whose metadata (and ``ditax_sample.json`` beside it) says how the
   student samples.
3. **score** — :func:`ditax.recipes.flux_parts.score_folder` on every combination x
   :attr:`Sizes.score_seeds`: the teacher as its ``ditax_sample.json`` says vs the student
   with its LoRA's settings, seen and held-out combinations apart, per seed, with the median
   seconds per image of each (the compiling first call left out).
4. **ship** — ``lora.safetensors`` + ``ditax_sample.json`` + ``score.json`` +
   ``manifest.json`` (every file's sha256) into the ship folder (``--folder``; default
   ``OUT/student``; ``src/ditax/assets/flux_demo_student`` is the shipped one).

``FULL`` is the shipped student (``python -m ditax.recipes.flux_demo_student``); ``SMOKE`` the
same recipe at toy sizes on the same teacher (tests).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import statistics
import time
from dataclasses import dataclass

from ditax.recipes.common import StudentRecipe, StudentSizes, recipe_main

LORA_FILE = "lora.safetensors"
SAMPLE_FILE = "ditax_sample.json"
SCORE_FILE = "score.json"
STAGES = StudentRecipe.STAGES
# the pipeline call's keys among the teacher's ditax_sample.json that the student keeps (the
# image and its text length); steps, guidance and sigmas are the student's own
SIZE_KEYS = ("height", "width", "max_sequence_length")


@dataclass(frozen=True)
class Sizes(StudentSizes):
    """Everything that sets the cost (and the result) of the recipe: the student's sizes
    (text_len: T5 tokens, the teacher's max_sequence_length; shift 0: the teacher's training
    shift, 3; guidance: the teacher's true-CFG scale) and these."""

    images: int                  # training images (prompts + latents; seen combinations)
    size: int                    # height = width (the teacher's)
    sigmas: tuple | None         # distill.sigmas (None: 1, 0.75, 0.5, 0.25)
    score_prompts: int           # prompts scored (0: all 40; else the first n)


# Chosen by short runs (2 shared CPU cores; score over all 40 prompts x seeds 0-9, the
# teacher's 20 steps: seen colour 98.0%, position 98.6%; the teacher itself in the student's
# 4 Euler steps, no LoRA: 96.9%, 98.6%). Rank 16, batch 16, 3 critic updates, no true CFG
# in the real score (the teacher is sampled without it), sigmas 1, 0.75, 0.5, 0.25 at the
# teacher's shift 3: lr 1e-3 for 200 steps: 97.7%, 98.9% (5 min); for 600: 94.9%, 96.9% (more
# empty images: it drifts); lr 3e-4 for 400 steps: 99.4%, 99.4% (10 min; held out 98%, 98%
# against the teacher's 86%, 90%), with seed 1: 98.6%, 98.9%. DMD2's GAN term was not needed.
FULL = Sizes(images=280, size=64, text_len=8, student_steps=4, sigmas=None, shift=0.0,
             guidance=1.0, rank=16, steps=400, batch=16, lr=3e-4, critic_lr=0.0,
             critic_updates=3, warmup=10, checkpoint_every=100,
             score_seeds=tuple(range(10)), score_prompts=0)
SMOKE = dataclasses.replace(FULL, images=8, size=32, rank=4, steps=2, batch=8, critic_updates=1,
                            warmup=0, checkpoint_every=2, score_seeds=(0,), score_prompts=3)
SIZES = {"full": FULL, "smoke": SMOKE}


class _Timed:
    """A pipeline whose calls are timed (``seconds``, one per call)."""

    def __init__(self, pipe):
        self.pipe = pipe
        self.seconds: list[float] = []

    def __call__(self, *a, **kw):
        t0 = time.perf_counter()
        out = self.pipe(*a, **kw)
        self.seconds.append(time.perf_counter() - t0)
        return out

    @property
    def last_stats(self):
        return self.pipe.last_stats


class Recipe(StudentRecipe):
    """One run of the recipe into ``out`` (work files) and ``folder`` (the shipped student).
    ``teacher``: the teacher's ``FluxPipeline`` folder (default the shipped small Flux)."""

    NAME = "flux-demo-student"
    WHAT = "small Flux student (DMD2 loss)"
    TEACHER = "flux_model_path"

    def teacher_call(self) -> dict:
        """The teacher's pipeline call: its folder's ``ditax_sample.json`` at the recipe's
        size."""
        from ditax.io.files import read_model_json

        s = self.sizes
        call = dict(read_model_json(self.teacher / SAMPLE_FILE, SAMPLE_FILE))
        return {**call, "height": s.size, "width": s.size, "max_sequence_length": s.text_len}

    def student_call(self) -> dict:
        """The student's pipeline call: the teacher's size and text length, the steps,
        guidance and sigmas its LoRA carries (its flow shift goes to the loader, from the
        LoRA)."""
        from ditax.pipelines.lora_sample import LOAD_KEYS

        settings = json.loads((self.out / "distill" / SAMPLE_FILE).read_text())
        size = {k: v for k, v in self.teacher_call().items() if k in SIZE_KEYS}
        return {**size, **{k: v for k, v in settings.items() if k not in LOAD_KEYS}}

    # --- stages
    def data(self):
        from ditax.synthetic.images import write_image_dataset
        from ditax.train.preprocess import preprocess

        s = self.sizes
        for sub in ("images", "latents"):
            if (self.out / sub).exists():
                shutil.rmtree(self.out / sub)
        # seed + 7: other images than the teacher's (seed 0), the same combinations
        write_image_dataset(self.out / "images", s.images, self.seed + 7, s.size, s.size)
        lines = []
        preprocess(self.out / "images", self.out / "latents", self.teacher, height=s.size,
                   width=s.size, frames=1, text_len=s.text_len, batch=16, say=lines.append)
        return {"images": s.images}

    def distill_config(self):
        from ditax.config import load_config

        s = self.sizes
        t = json.loads((self.teacher / "transformer" / "config.json").read_text())
        model = [f"model.{k}={json.dumps(v) if isinstance(v, list) else v}"
                 for k, v in t.items() if not k.startswith("_") and v is not None]
        sched = json.loads((self.teacher / "scheduler" / "scheduler_config.json").read_text())
        sigmas = "none" if s.sigmas is None else ",".join(f"{x:g}" for x in s.sigmas)
        log_every = max(1, min(10, s.steps // 5))
        return load_config("flux-tiny", model + self.distill_args(1, s.size, s.size, log_every) + [
            # the critic's noise levels: the teacher's training flow (uniform, fixed shift)
            "flow.timestep_sampler=uniform", "flow.dynamic_shift=false",
            f"flow.shift={sched.get('shift', 3.0)}", f"distill.sigmas={sigmas}"])

    def student_pipeline(self, lora=None):
        """The teacher's folder with the student's LoRA (``lora``: default the run's): the
        LoRA's sampling settings become the pipeline's defaults (its flow shift at load)."""
        from ditax.pipelines.flux.loading import load_pipeline

        return load_pipeline(self.teacher,
                             loras=[(str(lora or self.out / "distill" / LORA_FILE), 1.0)])

    def score(self):
        from ditax.pipelines.flux.loading import load_pipeline
        from ditax.recipes.flux_parts import score_folder
        from ditax.synthetic.images import all_placements

        s = self.sizes
        prompts = [p.prompt for p in all_placements()]
        prompts = prompts[:s.score_prompts] if s.score_prompts else prompts
        res = {}
        for who, pipe, call in (("teacher", load_pipeline(self.teacher), self.teacher_call()),
                                ("student", self.student_pipeline(), self.student_call())):
            pipe(prompts[0], seed=s.score_seeds[0], progress=False, **call)     # compile
            timed = _Timed(pipe)
            sc = score_folder(None, call, s.score_seeds, prompts=prompts, pipe=timed)
            res[who] = {"call": call, "transformer_calls": pipe.last_stats["transformer_calls"],
                        "median_seconds_per_image": round(statistics.median(timed.seconds), 4),
                        **sc}
            self.say(f"  {who}: seen colour {sc['seen']['colour']:.1%} position "
                     f"{sc['seen']['position']:.1%}; {res[who]['median_seconds_per_image']:.3f}"
                     f" s/image, {res[who]['transformer_calls']} transformer calls")
        (self.out / SCORE_FILE).write_text(json.dumps(res, indent=1))
        summary = {who: {k: v for k, v in r.items() if k != "rows"} for who, r in res.items()}
        t, st = res["teacher"], res["student"]
        return {**summary, "speedup": round(t["median_seconds_per_image"] /
                                            st["median_seconds_per_image"], 2)}

    def ship_files(self, f):
        shutil.copy(self.out / "distill" / LORA_FILE, f / LORA_FILE)
        shutil.copy(self.out / "distill" / SAMPLE_FILE, f / SAMPLE_FILE)
        scores = json.loads((self.out / SCORE_FILE).read_text())
        (f / SCORE_FILE).write_text(json.dumps(
            {who: {k: v for k, v in r.items() if k != "rows"} for who, r in scores.items()},
            indent=1) + "\n")


def main(argv=None) -> int:
    return recipe_main(argv, Recipe, SIZES, prog="python -m ditax.recipes.flux_demo_student",
                       description=__doc__.split("\n\n")[0], default_out="flux_demo_student")


if __name__ == "__main__":
    raise SystemExit(main())
