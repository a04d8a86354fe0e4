"""Sampling time of a few-step student beside its teacher, in one run (JSON lines on stdout).

    python benchmarks/distill.py                      # the demo Wan model and its 4-step student
    python benchmarks/distill.py --flux               # the small FLUX.1 and its student
    python benchmarks/distill.py --model DIR --lora student.safetensors --repeats 5

For each of ``--prompts`` prompts, the teacher's call (its folder's settings: 25 steps with
classifier-free guidance on the demo model) and the student's (the LoRA's sampling settings:
4 Euler steps, no guidance) run alternately ``--repeats`` times after one warm-up each (the
compile). Reported per model: transformer calls per sample, the median denoise seconds and the
median whole-call seconds; then the ratio. Medians, because this machine is noisy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def emit(**kw):
    print(json.dumps(kw), flush=True)


def timed(pipe, prompt, seed, kwargs):
    t0 = time.perf_counter()
    pipe(prompt, seed=seed, **kwargs)
    return time.perf_counter() - t0, pipe.timings.denoise, pipe.last_stats["transformer_calls"]


def main(argv=None) -> int:
    import ditax
    import ditax.demo as demo

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="teacher pipeline folder (default: the demo model)")
    ap.add_argument("--lora", help="student LoRA file (default: the demo student)")
    ap.add_argument("--flux", action="store_true", help="the small FLUX.1 and its student")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    if args.flux:
        model = args.model or demo.flux_model_path()
        lora = args.lora or demo.flux_student_lora_path()
        teacher_kw, student_kw = dict(demo.FLUX_SAMPLE), dict(demo.FLUX_STUDENT_SAMPLE)
        prompts = list(demo.FLUX_PROMPTS)[:args.prompts]
    else:
        model = args.model or demo.model_path()
        lora = args.lora or demo.student_lora_path()
        teacher_kw, student_kw = dict(demo.SAMPLE), dict(demo.STUDENT_SAMPLE)
        prompts = list(demo.DEMO_PROMPTS)[:args.prompts]
    load = {k: student_kw.pop(k) for k in ("scheduler", "flow_shift") if k in student_kw}
    teacher = ditax.load_pipeline(model)
    student = ditax.load_pipeline(model, loras=[(str(lora), 1.0)], **load)
    rows = {"teacher": [], "student": []}
    for name, pipe, kw in (("teacher", teacher, teacher_kw), ("student", student, student_kw)):
        timed(pipe, prompts[0], 0, kw)          # compile
    for r in range(args.repeats):
        for i, prompt in enumerate(prompts):
            for name, pipe, kw in (("teacher", teacher, teacher_kw),
                                   ("student", student, student_kw)):
                rows[name].append(timed(pipe, prompt, 100 + r * 10 + i, kw))
    out = {}
    for name, got in rows.items():
        out[name] = dict(calls=got[0][2], denoise_s=statistics.median(g[1] for g in got),
                         call_s=statistics.median(g[0] for g in got), samples=len(got))
        emit(bench="distill_sampling", model=str(model), who=name,
             steps=(teacher_kw if name == "teacher" else student_kw).get("num_inference_steps"),
             transformer_calls=out[name]["calls"], denoise_s=round(out[name]["denoise_s"], 4),
             call_s=round(out[name]["call_s"], 4), samples=len(got), unit="s (median)")
    emit(bench="distill_sampling", model=str(model), who="ratio",
         calls=f"{out['teacher']['calls']} / {out['student']['calls']}",
         denoise_speedup=round(out["teacher"]["denoise_s"] / out["student"]["denoise_s"], 2),
         call_speedup=round(out["teacher"]["call_s"] / out["student"]["call_s"], 2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
