"""Faster videos, measured. One JSON object per line, two parts in one run (``--only`` picks one):

1. ``first_video``: time to first video in a fresh process: ``ditax generate`` with jax's
   persistent compilation cache cold, warm and off, vs diffusers' ``WanPipeline`` on the same
   folder in the same run;
2. ``step_cache``: for each step-cache method (first_block, teacache, magcache) at three
   thresholds, and CFG reuse: transformer calls, denoise-loop time (``value``: fastest of
   ``--cache-repeats`` per prompt, summed; ``call_s`` the whole call), speed-up (``ratio``: vs
   the uncached loop timed in the same repeats), PSNR / SSIM of
   the video vs the uncached video of the same prompt and noise (means over the prompts), plus
   a PNG plot of speed-up vs PSNR per method (``--plot``; needs matplotlib, the ``[bench]``
   extra). TeaCache / MagCache use the model's numbers: ``--coefficients FILE``, else the
   shipped ones when the model has them, else they are measured first with the library of
   ``ditax calibrate-cache`` on the benchmark's settings (row ``calibration``). With
   ``--demo-score`` (the trained demo model: prompts of its vocabulary) each row also has the
   prompt-following score of :func:`ditax.synthetic.score` (share of prompts whose colour,
   shape and direction all come out right), next to the uncached score.

Each run is a new Python process timed from spawn to exit by this script: interpreter start,
imports, loading the folder, text encoding, (compilation or cache reads), denoising, VAE decode
and writing the mp4. ditax runs the real command line (``python -m ditax.cli generate``); diffusers
runs a script that loads ``WanPipeline.from_pretrained(folder)``, generates the same request
and writes the mp4 with ``diffusers.utils.export_to_video``. Modes:

- ``cold``: a new, empty cache folder every run (compile everything and write it);
- ``warm``: a folder the cold runs filled (every program read from disk);
- ``off``: ``compile_cache=none`` (compile everything, write nothing).

The model (``--model PATH``, a pipeline folder) defaults to the demo-size random pipeline
(:func:`ditax.demo.build_pipeline_folder`: D=128 transformer, 16-channel VAE, 64-wide UMT5).
First-video values are medians over ``--runs`` processes per
mode, the modes interleaved round by round (a busy machine slows them alike);
``ratio`` = diffusers' median / ours (above 1: ditax is faster). ditax's own timing line is
parsed for its per-phase medians (``phases``).

    python benchmarks/speed.py [--model PATH] [--only first_video|step_cache] [--runs 3]
        [--steps 8] [--cache-steps 20] [--height 64] [--width 96] [--frames 17]
        [--coefficients numbers.json] [--demo-score] [--plot step_cache.png]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

os.environ.setdefault("JAX_PLATFORMS", "cpu")   # this process builds the folder with jax

PROMPT = "a cat walks on the grass in the sun"
NEGATIVE = "blurry, low quality"

DIFFUSERS = """
import sys, torch
from diffusers import WanPipeline
from diffusers.utils import export_to_video
folder, out, h, w, f, steps = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:7])
pipe = WanPipeline.from_pretrained(folder)
pipe.set_progress_bar_config(disable=True)
with torch.no_grad():
    video = pipe(prompt=%r, negative_prompt=%r, height=h, width=w, num_frames=f,
                 num_inference_steps=steps, guidance_scale=5.0,
                 generator=torch.Generator().manual_seed(0), output_type="np").frames[0]
export_to_video(list(video), out, fps=16)
""" % (PROMPT, NEGATIVE)


def emit(**kw):
    print(json.dumps(kw), flush=True)


def timed(cmd: list[str], env: dict) -> tuple[float, str]:
    """Seconds from spawn to exit of ``cmd``, and its stdout (fails loudly)."""
    t0 = time.perf_counter()
    run = subprocess.run(cmd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed:\n{run.stderr[-3000:]}")
    return seconds, run.stdout


def phases(stdout: str) -> dict[str, float]:
    """``{"load": 0.8, "text": ..., "compile": ..., ...}`` from ditax's timing line."""
    line = next(l for l in stdout.splitlines() if l.startswith("timing:"))
    return {k: float(v) for k, v in re.findall(r"(\w+) ([\d.]+)s", line)}


def ditax_cmd(folder, args, out: pathlib.Path, cache) -> list[str]:
    """``ditax generate`` of the benchmark's request into ``out`` with ``compile_cache=cache``."""
    return [sys.executable, "-m", "ditax.cli", "generate", "--model", str(folder),
            "--prompt", PROMPT, "--negative-prompt", NEGATIVE, "--height", str(args.height),
            "--width", str(args.width), "--frames", str(args.frames), "--steps",
            str(args.steps), "--guidance", "5.0", "--seed", "0", "--no-progress",
            "--output", str(out), f"compile_cache={cache}"]


def ditax_run(folder, args, work: pathlib.Path, env: dict, mode: str, i: int):
    """Seconds and parsed timing line of one fresh ``ditax generate`` process in ``mode``."""
    cache = {"cold": work / f"cold-cache-{i}", "warm": work / "warm-cache", "off": "none"}[mode]
    s, out = timed(ditax_cmd(folder, args, work / f"ditax-{mode}-{i}.mp4", cache), env)
    return s, phases(out)


def diffusers_run(folder, args, work: pathlib.Path, env: dict, i: int) -> float:
    return timed([sys.executable, "-c", DIFFUSERS, str(folder), str(work / f"diffusers-{i}.mp4"),
                  str(args.height), str(args.width), str(args.frames), str(args.steps)], env)[0]


def first_video(folder, args, work: pathlib.Path) -> None:
    """Part 1: fresh-process time to first video, cache cold / warm / off vs diffusers."""
    env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"),
               TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    env.pop("DITAX_CACHE_DIR", None)
    case = f"{args.frames}x{args.height}x{args.width}, {args.steps} steps, CFG"

    timed(ditax_cmd(folder, args, work / "fill.mp4", work / "warm-cache"), env)  # fill, untimed
    # rounds interleave the modes, so a busy machine slows them alike
    modes = ("cold", "warm", "off")
    base_runs, runs, parts = [], {m: [] for m in modes}, {m: [] for m in modes}
    for i in range(args.runs):
        base_runs.append(diffusers_run(folder, args, work, env, i))
        for mode in modes:
            s, ph = ditax_run(folder, args, work, env, mode, i)
            runs[mode].append(s)
            parts[mode].append(ph)
    base = statistics.median(base_runs)
    emit(bench="speed", case=case, metric="first_video_s", mode="diffusers",
         value=round(base, 3), unit="s", runs=[round(s, 3) for s in base_runs],
         name="diffusers WanPipeline (torch CPU), fresh process")
    for mode in modes:
        med = statistics.median(runs[mode])
        emit(bench="speed", case=case, metric="first_video_s", mode=mode, value=round(med, 3),
             unit="s", runs=[round(s, 3) for s in runs[mode]], baseline=round(base, 3),
             ratio=round(base / med, 3), baseline_name="diffusers (torch CPU), fresh process",
             phases={k: round(statistics.median(d[k] for d in parts[mode]), 3)
                     for k in parts[mode][0]})


# ----------------------------------------------------------------------------------------------
# part 2: step caching

THRESHOLDS = {"first_block": (0.03, 0.08, 0.15), "teacache": (0.1, 0.2, 0.4),
              "magcache": (0.06, 0.12, 0.24)}
CACHE_PROMPTS = ["a cat walks on the grass in the sun", "a red car drives through the rain"]


def parse_thresholds(text: str) -> tuple[str, tuple[float, ...]]:
    """``--thresholds first_block=0.1,0.2,0.4`` → ``("first_block", (0.1, 0.2, 0.4))``."""
    method, _, values = text.partition("=")
    if method not in THRESHOLDS or not values:
        raise SystemExit(f"--thresholds {text!r}: give METHOD=a,b,c with METHOD one of "
                         f"{', '.join(THRESHOLDS)}")
    return method, tuple(float(v) for v in values.split(","))


def psnr(a: np.ndarray, b: np.ndarray) -> float | None:
    """dB for videos in [0, 1]; None when identical."""
    mse = float(np.mean((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2))
    return None if mse == 0 else 10 * math.log10(1.0 / mse)


def ssim(a: np.ndarray, b: np.ndarray, win: int = 7) -> float:
    """Mean SSIM over frames and channels (uniform ``win`` x ``win`` window, data range 1)."""
    from scipy.ndimage import uniform_filter

    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)     # [F, H, W, 3]
    c1, c2 = 0.01 ** 2, 0.03 ** 2
    size = (1, win, win, 1)
    mu_a, mu_b = uniform_filter(a, size), uniform_filter(b, size)
    var_a = uniform_filter(a * a, size) - mu_a ** 2
    var_b = uniform_filter(b * b, size) - mu_b ** 2
    cov = uniform_filter(a * b, size) - mu_a * mu_b
    s = ((2 * mu_a * mu_b + c1) * (2 * cov + c2)) / (
        (mu_a ** 2 + mu_b ** 2 + c1) * (var_a + var_b + c2))
    return float(s.mean())


def demo_prompts(n: int) -> list[str]:
    from ditax.synthetic.vocab import canonical_prompt, seen_combinations

    return [canonical_prompt(c.colour, c.shape, c.direction) for c in seen_combinations()[:n]]


def step_cache(folder, args, work: pathlib.Path) -> None:
    """Part 2: each method x threshold (and CFG reuse) vs the uncached videos."""
    import ditax
    from ditax.pipelines.cache_numbers import find_numbers, write_numbers
    from ditax.pipelines.calibrate import calibrate

    req = dict(negative_prompt=NEGATIVE, height=args.height, width=args.width,
               num_frames=args.frames, num_inference_steps=args.cache_steps,
               guidance_scale=5.0, progress=False)
    load = {}
    if args.demo_score:          # the demo model, sampled as it is meant to be (its SAMPLE)
        from ditax.demo import SAMPLE

        req.update(negative_prompt=SAMPLE["negative_prompt"],
                   guidance_scale=SAMPLE["guidance_scale"])
        load["max_sequence_length"] = SAMPLE["max_sequence_length"]
    pipe = ditax.load_pipeline(folder, **load)
    pipe.compile_cache = "none"      # compile times are not what this part measures
    prompts = demo_prompts(args.prompts) if args.demo_score else CACHE_PROMPTS[:args.prompts]
    case = (f"{args.frames}x{args.height}x{args.width}, {args.cache_steps} steps, CFG, "
            f"{len(prompts)} prompts")
    coefficients = args.coefficients
    experts = 1 if pipe.transformer_2 is None else 2
    if coefficients is None and find_numbers(pipe.transformer.config, experts) is None:
        t0 = time.perf_counter()
        entry = calibrate(pipe, CACHE_PROMPTS if not args.demo_score else demo_prompts(4),
                          name=pathlib.Path(str(folder)).name, **req)
        coefficients = write_numbers(work / "cache_numbers.json", entry)
        emit(bench="speed", case=case, metric="calibration_s", value=round(
            time.perf_counter() - t0, 3), unit="s", numbers=str(coefficients),
             teacache=entry["teacache"]["coefficients"], magcache=entry["magcache"]["ratios"])

    compiled = set()

    def run(**cache) -> tuple[list, float, dict]:
        """Videos of every prompt, their seconds (compiled beforehand), the last stats."""
        key = (cache.get("cache"), cache.get("cfg_cache", False))
        if key not in compiled:     # one program per method (any threshold), untimed
            pipe(prompts[0], seed=0, cache_coefficients=coefficients, **req, **cache)
            compiled.add(key)
        videos, seconds, wall, base_s = [], 0.0, 0.0, 0.0
        for k, prompt in enumerate(prompts):
            # fastest of --cache-repeats, each repeat timing the uncached step right before
            # (a shared machine slows both alike: the ratio is of times measured together)
            best = best_wall = best_base = math.inf
            for _ in range(args.cache_repeats):
                if cache:
                    pipe(prompt, seed=k, **req)
                    best_base = min(best_base, pipe.timings.denoise)
                t0 = time.perf_counter()
                video = pipe(prompt, seed=k, cache_coefficients=coefficients, **req, **cache)
                best_wall = min(best_wall, time.perf_counter() - t0)
                best = min(best, pipe.timings.denoise)
            videos.append(video)
            seconds, wall = seconds + best, wall + best_wall
            base_s += best_base if cache else best
        return videos, seconds, dict(pipe.last_stats, call_s=round(wall, 3),
                                     base_s=round(base_s, 3))

    def scored(videos) -> float | None:
        if not args.demo_score:
            return None
        from ditax.synthetic import score

        return float(np.mean([score(v, p)["all_correct"] for v, p in zip(videos, prompts)]))

    base, base_s, base_stats = run()
    base_score = scored(base)
    emit(bench="speed", case=case, metric="step_cache", method="none", threshold=None,
         cfg_cache=False, transformer_calls=base_stats["transformer_calls"],
         value=round(base_s, 3), unit="s", call_s=base_stats["call_s"],
         **({"score": base_score} if args.demo_score else {}))
    thresholds = dict(THRESHOLDS, **dict(parse_thresholds(t) for t in args.thresholds))
    configs = [(m, t, False) for m in thresholds for t in thresholds[m]]
    configs += [(None, None, True), ("magcache", thresholds["magcache"][1], True)]
    rows = []
    for method, thr, cfg in configs:
        videos, secs, st = run(cache=method, cache_threshold=thr, cfg_cache=cfg)
        q = [psnr(v, b) for v, b in zip(videos, base)]
        row = dict(bench="speed", case=case, metric="step_cache", method=method or "cfg_only",
                   threshold=thr, cfg_cache=cfg, transformer_calls=st["transformer_calls"],
                   calls_baseline=base_stats["transformer_calls"], value=round(secs, 3),
                   unit="s", baseline=st["base_s"], ratio=round(st["base_s"] / secs, 3),
                   call_s=st["call_s"],
                   psnr_db=None if None in q else round(float(np.mean(q)), 2),
                   ssim=round(float(np.mean([ssim(v, b) for v, b in zip(videos, base)])), 4),
                   skipped_steps=st["skipped_steps"],
                   cfg_reused_steps=st.get("cfg_reused_steps", []))
        if args.demo_score:
            row.update(score=scored(videos), score_baseline=base_score)
        emit(**row)
        rows.append(row)
    if args.plot:
        plot(rows, args.plot, case)


def plot(rows: list[dict], path: str, case: str) -> None:
    """Speed-up vs PSNR, one line per method through its thresholds."""
    try:
        import matplotlib
    except ImportError:
        emit(bench="speed", metric="plot", value=None, note="matplotlib missing: pip install "
             "'ditax[bench]'")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for method in sorted({(r["method"], r["cfg_cache"]) for r in rows}, key=str):
        pts = [(r["ratio"], r["psnr_db"] if r["psnr_db"] is not None else 100.0, r["threshold"])
               for r in rows if (r["method"], r["cfg_cache"]) == method]
        label = method[0] + (" + cfg_cache" if method[1] and method[0] != "cfg_only" else "")
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=label)
        for x, y, t in pts:
            if t is not None:
                ax.annotate(f"{t:g}", (x, y), textcoords="offset points", xytext=(4, 4),
                            fontsize=7)
    ax.set_xlabel("speed-up of the denoise loop vs uncached (x)")
    ax.set_ylabel("PSNR vs uncached video (dB)")
    ax.set_title(f"step caching: {case}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    emit(bench="speed", metric="plot", value=str(path))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", "--folder", dest="model", default=None,
                   help="pipeline folder (default: build the demo-size random one)")
    p.add_argument("--only", choices=("first_video", "step_cache"), default=None)
    p.add_argument("--runs", type=int, default=3, help="processes per mode (median)")
    p.add_argument("--steps", type=int, default=8, help="steps of the first-video part")
    p.add_argument("--cache-steps", type=int, default=20, help="steps of the step-cache part")
    p.add_argument("--prompts", type=int, default=2, help="prompts of the step-cache part")
    p.add_argument("--cache-repeats", type=int, default=2,
                   help="timed runs per prompt and setting in the step-cache part (fastest)")
    p.add_argument("--height", type=int, default=64)
    p.add_argument("--width", type=int, default=96)
    p.add_argument("--frames", type=int, default=17)
    p.add_argument("--coefficients", default=None, help="step-cache numbers file")
    p.add_argument("--thresholds", action="append", default=[], metavar="METHOD=a,b,c",
                   help="a method's three thresholds (default: " + "; ".join(
                       f"{m}={','.join(map(str, t))}" for m, t in THRESHOLDS.items()) + ")")
    p.add_argument("--demo-score", action="store_true",
                   help="the model is the trained demo: vocabulary prompts, score column")
    p.add_argument("--plot", default="step_cache_speed_psnr.png", help="PNG path ('' = none)")
    p.add_argument("--keep", action="store_true", help="keep the work folder (caches, videos)")
    args = p.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="ditax-speed-"))
    folder = args.model
    if folder is None:
        from ditax.demo import build_pipeline_folder

        folder = str(build_pipeline_folder(work / "pipe"))
    if args.only in (None, "first_video"):
        first_video(folder, args, work)
    if args.only in (None, "step_cache"):
        step_cache(folder, args, work)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
