"""Faster videos, measured. One JSON object per line, three parts in one run (``--only`` picks
one; the step-cache parts live in ``speed_cache.py``):

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
3. ``published``: the shipped (published) Wan 2.1 T2V 1.3B TeaCache and MagCache numbers on a
   random-weights transformer of Wan 1.3B's width (D 1536, 12 heads, FFN 8960) with
   ``--wide-layers`` blocks (CPU-sized) in the folder's pipeline: at each threshold,
   transformer calls, denoise time, speed-up and PSNR / SSIM vs the uncached video
   (``--wide-steps`` steps, one prompt).

Each run is a new Python process timed from spawn to exit by this script: interpreter start,
imports, loading the folder, text encoding, (compilation or cache reads), denoising, VAE decode
and writing the mp4. ditax runs the real command line (``python -m ditax.cli generate``); diffusers
runs a script that loads ``WanPipeline.from_pretrained(folder)``, generates the same request
and writes the mp4 with ``diffusers.utils.export_to_video``. Modes:

- ``cold``: a new, empty cache folder every run (compile everything and write it);
- ``warm``: a folder the cold runs filled (every program read from disk);
- ``off``: ``compile_cache=none`` (compile everything, write nothing).

The model (``--model PATH``, a pipeline folder) defaults to the demo-size random pipeline
(:func:`ditax.demo.folders.build_pipeline_folder`: D=128 transformer, 16-channel VAE, 64-wide UMT5).
First-video values are medians over ``--runs`` processes per
mode, the modes interleaved round by round (a busy machine slows them alike);
``ratio`` = diffusers' median / ours (above 1: ditax is faster). ditax's own timing line is
parsed for its per-phase medians (``phases``).

    python benchmarks/speed.py [--model PATH] [--only first_video|step_cache|published]
        [--runs 3] [--steps 8] [--cache-steps 20] [--height 64] [--width 96] [--frames 17]
        [--coefficients numbers.json] [--demo-score] [--plot step_cache.png]
        [--wide-layers 2] [--wide-steps 20]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")   # this process builds the folder with jax

from speed_cache import (NEGATIVE, PROMPT, THRESHOLDS, emit, published,  # noqa: E402
                         step_cache)

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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", "--folder", dest="model", default=None,
                   help="pipeline folder (default: build the demo-size random one)")
    p.add_argument("--only", choices=("first_video", "step_cache", "published"), default=None)
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
    p.add_argument("--wide-layers", type=int, default=2,
                   help="blocks of the random 1.3B-width model of the published part")
    p.add_argument("--wide-steps", type=int, default=20, help="steps of the published part")
    p.add_argument("--demo-score", action="store_true",
                   help="the model is the trained demo: vocabulary prompts, score column")
    p.add_argument("--plot", default="step_cache_speed_psnr.png", help="PNG path ('' = none)")
    p.add_argument("--keep", action="store_true", help="keep the work folder (caches, videos)")
    args = p.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="ditax-speed-"))
    folder = args.model
    if folder is None:
        from ditax.demo.folders import build_pipeline_folder

        folder = str(build_pipeline_folder(work / "pipe"))
    if args.only in (None, "first_video"):
        first_video(folder, args, work)
    if args.only in (None, "step_cache"):
        step_cache(folder, args, work)
    if args.only in (None, "published"):
        published(folder, args, work)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
