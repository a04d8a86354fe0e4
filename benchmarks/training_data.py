"""Training data as users have it (issue 44): preprocessing throughput over processes, training
on one bucket vs several (JSON lines).

    python benchmarks/training_data.py                     # both parts
    python benchmarks/training_data.py --part preprocess --clips 24
    python benchmarks/training_data.py --part train --steps 24

``preprocess``: ``--clips`` captioned clips of mixed material (half landscape, half portrait,
17 frames) encoded by ``ditax preprocess --model demo`` into two buckets, at two bucket sizes
(``small``: 48x32 / 32x48, 9 frames; ``large``: 96x64 / 64x96, 17 frames), once by one process
and once by two (``--num-processes 2 --process-id K``, two OS processes at once on the same
folder). Reported: wall seconds from the launch to ``meta.json`` (each process's start-up —
JAX import, model load, compiles — included, as a user pays it), clips per second, and the
ratio of two processes to one. On a 2-core machine two processes share the cores.

``train``: the ``tiny`` preset on a dataset of one bucket (64x64x5) and on one of three buckets
(64x64x5, 128x64x5, 64x128x5) of the same total size, ``--steps`` steps each, batch 2, one
device. Reported: the median step time of the steps that compiled nothing (each shape's first
step compiles; the rows of ``metrics.jsonl`` say which), steps per second, tokens per second
over those steps (the two larger buckets hold twice the tokens a sample), how many steps
compiled (one per shape: the compiled step is reused per bucket shape), and the rows per
bucket.

Medians and ratios: these machines are noisy; every row is one run.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
SIZES = {"small": ("48x32x9,32x48x9", (9, 40, 60), (9, 60, 40)),
         "large": ("96x64x17,64x96x17", (17, 72, 108), (17, 108, 72))}


def emit(**kw) -> dict:
    print(json.dumps(kw), flush=True)
    return kw


def write_clips(folder: pathlib.Path, n: int, land, port) -> None:
    """``n`` captioned clips, alternately landscape (``land`` = frames, height, width) and
    portrait, of smooth random colour so the encoders see video-like input."""
    from ditax.io.video import write_mp4

    folder.mkdir(parents=True)
    r = np.random.default_rng(0)
    for i in range(n):
        f, h, w = land if i % 2 == 0 else port
        base = r.uniform(0, 1, (1, 1, 1, 3))
        ramp = np.linspace(0, 1, w)[None, None, :, None]
        clip = np.clip(base * 0.6 + 0.4 * ramp * r.uniform(0.5, 1, (f, 1, 1, 1)), 0, 1)
        write_mp4(folder / f"c{i:03d}.mp4", np.broadcast_to(clip, (f, h, w, 3)), fps=8)
        (folder / f"c{i:03d}.txt").write_text(f"clip number {i}, a colour ramp")


def preprocess(clips: pathlib.Path, out: pathlib.Path, buckets: str, processes: int) -> float:
    """Wall seconds of ``ditax preprocess`` over ``processes`` OS processes at once."""
    cmd = [sys.executable, "-m", "ditax.cli", "preprocess", str(clips), str(out), "--model",
           "demo", "--buckets", buckets, "--text-len", "16", "--batch", "4", "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    t0 = time.perf_counter()
    if processes == 1:
        runs = [subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)]
    else:
        runs = [subprocess.Popen(cmd + ["--num-processes", str(processes), "--process-id",
                                        str(k)], env=env, stdout=subprocess.DEVNULL)
                for k in range(processes)]
    codes = [p.wait() for p in runs]
    wall = time.perf_counter() - t0
    if any(codes) or not (out / "meta.json").is_file():
        raise SystemExit(f"preprocess failed ({codes}) into {out}")
    return wall


def part_preprocess(n: int, work: pathlib.Path) -> None:
    for size, (buckets, land, port) in SIZES.items():
        clips = work / f"clips_{size}"
        write_clips(clips, n, land, port)
        walls = {}
        for procs in (1, 2):
            out = work / f"ds_{size}_{procs}"
            walls[procs] = preprocess(clips, out, buckets, procs)
            meta = json.loads((out / "meta.json").read_text())
            emit(bench="training_data", part="preprocess", size=size, buckets=buckets,
                 processes=procs, clips=n, samples=meta["num_samples"],
                 wall_s=round(walls[procs], 2), clips_per_s=round(n / walls[procs], 3))
        emit(bench="training_data", part="preprocess", size=size, ratio="2 processes / 1",
             throughput=round(walls[1] / walls[2], 2))


def part_train(steps: int, work: pathlib.Path) -> None:
    sys.path.insert(0, str(ROOT / "tests" / "refs"))
    from bucket_datasets import write_bucketed

    from ditax.config import load_config
    from ditax.train.loop import train

    runs = {"one bucket": {"64x64x5": 24},
            "three buckets": {"64x64x5": 8, "128x64x5": 8, "64x128x5": 8}}
    rates = {}
    for name, counts in runs.items():
        ds, _ = write_bucketed(work / f"train_{len(counts)}", counts)
        out = work / f"run_{len(counts)}"
        cfg = load_config("tiny", [f"data.source={ds}", f"output_dir={out}", f"steps={steps}",
                                   "batch_size=2", "checkpoint.every=1000",
                                   "mesh.data=1", "mesh.fsdp=1", "mesh.context=1",
                                   "mesh.tensor=1"])
        t0 = time.perf_counter()
        train(cfg, progress=False)
        wall = time.perf_counter() - t0
        rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        rows = [r for r in rows if "step_time" in r]
        warm = [r["step_time"] for r in rows if not r.get("includes_compile")]
        # tokens over time, both summed over the steps that compiled nothing
        tok = sum(r["tokens_per_s"] * r["step_time"] for r in rows
                  if not r.get("includes_compile")) / sum(warm)
        per = {}
        for r in rows:
            per[r.get("bucket", "-")] = per.get(r.get("bucket", "-"), 0) + 1
        med = statistics.median(warm)
        rates[name] = (1 / med, tok)
        emit(bench="training_data", part="train", dataset=name, steps=len(rows),
             compiled_steps=sum(bool(r.get("includes_compile")) for r in rows),
             median_step_s=round(med, 4), steps_per_s=round(1 / med, 2),
             tokens_per_s=round(tok),
             wall_s=round(wall, 1), rows_per_bucket=per)
    (s3, t3), (s1, t1) = rates["three buckets"], rates["one bucket"]
    emit(bench="training_data", part="train", ratio="three buckets / one",
         steps_per_s=round(s3 / s1, 2), tokens_per_s=round(t3 / t1, 2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=("preprocess", "train", "all"), default="all")
    ap.add_argument("--clips", type=int, default=24)
    ap.add_argument("--steps", type=int, default=24)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        if a.part in ("preprocess", "all"):
            part_preprocess(a.clips, work)
        if a.part in ("train", "all"):
            part_train(a.steps, work)


if __name__ == "__main__":
    main()
