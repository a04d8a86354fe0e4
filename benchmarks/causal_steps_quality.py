"""What fewer steps and a shorter KV cache cost the demo's causal student (issue 59 item 5):
the chip streams a Wan 1.3B-size student faster than real time only at the sink + 1 chunk of
context and 2 Euler steps (``docs/causal_streaming.md``), where the student was distilled for
4 steps and ships with 3 chunks of context. This scores the shipped demo causal student
(:func:`ditax.demo.causal_model_path`, or ``--student``) at each setting with the demo
world's scorer per window of the teacher's frames (:func:`ditax.demo.causal.run_model`, as
its recipe's score stage), at 1x and 4x the teacher's length, every combination x
``--seeds``; one JSON line per setting and length:

    {"bench": "causal_steps_quality", "case": "steps2_ctx1", "frames": 77, "metric":
     "colour", "value": 52.5, "unit": "%", "direction": ..., "sigmas": [...], ...}

    python benchmarks/causal_steps_quality.py [--settings 4:3 2:1 ...] [--prompts N]
        [--out docs/causal_steps_quality.jsonl]

A setting ``S:C`` samples ``S`` Euler steps at every ``4 / S``-th of the student's own
sigmas (its ``ditax_sample.json``: 1.0, 0.75, 0.5, 0.25; 2 steps take 1.0 and 0.5) with
``C`` chunks of context beside the sink.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from bench_lines import emit


def subset_sigmas(sigmas, steps: int) -> list[float]:
    """``steps`` of the student's distilled ``sigmas``, evenly strided from the first (a DMD
    student denoises from each of its own levels; other levels it never saw)."""
    n = len(sigmas)
    if steps < 1 or n % steps:
        raise SystemExit(f"causal_steps_quality.py: {steps} steps do not divide the student's "
                         f"{n} sigmas {list(sigmas)}: use a divisor of {n}")
    return [float(s) for s in sigmas[:: n // steps]]


def parse_setting(text: str) -> tuple[int, int]:
    try:
        steps, ctx = (int(x) for x in text.split(":"))
    except ValueError:
        raise SystemExit(f"causal_steps_quality.py --settings: {text!r} is not STEPS:CONTEXT, "
                         "e.g. 2:1") from None
    return steps, ctx


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--student", default=None, help="a causal student folder (default: shipped)")
    p.add_argument("--settings", nargs="+", default=["4:3", "4:1", "2:3", "2:1"],
                   help="STEPS:CONTEXT_CHUNKS each")
    p.add_argument("--seeds", type=int, nargs="+", default=[1000])
    p.add_argument("--prompts", type=int, default=0, help="first N combinations (0: all)")
    p.add_argument("--long", type=int, default=4, help="the long video, x the teacher's length")
    p.add_argument("--out", default=None, help="also append the lines to this file")
    a = p.parse_args(argv)
    settings = [parse_setting(s) for s in a.settings]

    import ditax.demo
    from ditax.demo.causal import long_frames, run_model
    from ditax.pipelines.family import pipelines_of
    from ditax.pipelines.sample_defaults import read_sample_defaults
    from ditax.pipelines.wan.loading import load_pipeline
    from ditax.synthetic.vocab import all_combinations

    folder = a.student or str(ditax.demo.causal_model_path())
    # the student's own sigmas, read and checked as its loader reads them
    sigmas = read_sample_defaults(folder, pipelines_of("wan").sample_file_rules())["sigmas"]
    for steps, _ in settings:
        subset_sigmas(sigmas, steps)            # refuse before any work
    teacher = read_sample_defaults(ditax.demo.model_path())
    frames, size = teacher["num_frames"], {k: teacher[k] for k in ("height", "width")}
    combos = all_combinations()
    prompts = [c.prompt for c in (combos[:a.prompts] if a.prompts else combos)]
    pipe = load_pipeline(folder)
    n_long = long_frames(frames, pipe.vae.scale_factor_temporal, a.long)
    for steps, ctx in settings:
        sig = subset_sigmas(sigmas, steps)
        for n in (frames, n_long):
            t0 = time.perf_counter()
            call = {**size, "num_frames": n, "num_inference_steps": steps, "sigmas": sig,
                    "context_chunks": ctx}
            res = run_model(pipe, prompts, a.seeds, call, frames, f"steps{steps}_ctx{ctx}",
                            say=lambda m: print(m, file=sys.stderr))
            row = {"bench": "causal_steps_quality", "case": f"steps{steps}_ctx{ctx}",
                   "steps": steps, "context_chunks": ctx, "sigmas": sig, "frames": n,
                   "window": frames, "windows": res["windows"], "prompts": len(prompts),
                   "seeds": a.seeds, "student": os.path.relpath(folder),
                   "score": res["score"], "seconds": round(time.perf_counter() - t0, 1)}
            for metric in ("colour", "direction"):
                emit({**row, "metric": metric, "value": res["score"][metric], "unit": "%"},
                     a.out)


if __name__ == "__main__":
    main()
