"""A 480p video end to end on one chip (issue 54, item 5), every phase timed, cold and warm
compile cache; and the demo model's own video on the chip.

On the lent chip, after ``source benchmarks/tpu_setup.sh``:

    python benchmarks/tpu_video.py --out $OUT/video.jsonl [--video $OUT/wan.mp4]

1. a random-weight Wan 2.1 1.3B pipeline folder is written on the chip's host (CPU only:
   ``python -m ditax.recipes.random_pipeline --preset wan2.1-t2v-1.3b``; the real transformer
   and VAE, UMT5 of the real width 4096 cut to ``--text-layers`` blocks);
2. ``ditax generate`` of that folder (480x832x81, 4 steps, guidance 1: a student's sampling,
   no CFG) in a fresh process, first with an empty persistent compile cache (cold), then
   with the cache the cold run filled (warm): one row each, ``value`` = the process's wall
   seconds, ``phases`` = generate's own timing line (load, text, compile, denoise, decode,
   write: what is left of the mp4's write after the decode, and ``overlapped``: the seconds
   ffmpeg encoded beside the decode); ``--override KEY=VALUE`` (repeatable) goes to its
   ``ditax generate`` as a config override and into its rows (``overrides``), e.g.
   ``--override model.vae_dtype=bfloat16`` (a bf16 VAE) or ``--override
   attention.sparsity=vsa`` (a sparse-attention student's sampling);
3. the demo model's video (``ditax generate --model demo``: its shipped sample settings),
   cold and warm.

Each process opens the chip itself (one at a time); rows go to stdout and ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

PROMPT = "a red fox runs through fresh snow at dawn, cinematic"


def emit(out: str, row: dict) -> None:
    line = json.dumps(row)
    print(line, flush=True)
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")


def phases(stdout: str) -> dict:
    """generate's ``timing:`` line as ``{"load": s, "text": s, ...}`` ({} when absent)."""
    line = next((x for x in stdout.splitlines() if x.startswith("timing:")), "")
    return {k: float(v) for k, v in re.findall(r"(\w+) ([\d.]+)s", line)}


def run(cmd: list, timeout: float, env=None) -> tuple:
    """(wall s, return code, stdout, stderr tail) of one process."""
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc, out, err = 124, str(e.stdout or ""), f"timed out after {timeout} s"
    return time.perf_counter() - t0, rc, out, err.strip()[-600:]


def generate(args, model, size, mode, cache, video) -> dict:
    cmd = [sys.executable, "-m", "ditax.cli", "generate", "--prompt", PROMPT, "--seed", "0",
           "--no-progress", "--output", video, f"compile_cache={cache}"]
    if model:
        h, w, f = size
        cmd += ["--model", model, "--height", str(h), "--width", str(w), "--frames", str(f),
                "--steps", str(args.steps), "--guidance", "1", "model.dtype=bfloat16",
                *args.override]
    else:
        cmd += ["--model", "demo"]      # the shipped demo model with its own sample settings
    wall, rc, out, err = run(cmd, args.timeout)
    row = {"bench": "tpu_video", "case": ("Wan 1.3B-size " if model else "demo model ")
           + (f"{size[0]}x{size[1]}x{size[2]}, {args.steps} steps, no CFG" if model else "video"),
           "mode": mode, "metric": "wall", "unit": "s", "phases": phases(out)}
    if model and args.override:
        row["overrides"] = list(args.override)
    if rc:
        row["error"] = f"exit {rc}: {err}"
    else:
        row["value"] = round(wall, 2)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    p.add_argument("--folder", default="/tmp/wan13-random")
    p.add_argument("--video", default=None, help="keep the warm run's mp4 here")
    p.add_argument("--size", default="480x832x81")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--text-layers", type=int, default=2)
    p.add_argument("--timeout", type=float, default=400)
    p.add_argument("--skip", nargs="*", default=[], choices=["wan", "demo"])
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override of the Wan case's ditax generate (repeatable): "
                        "model.vae_dtype=bfloat16, attention.sparsity=vsa, ...")
    a = p.parse_args()
    size = tuple(int(x) for x in a.size.split("x"))
    work = tempfile.mkdtemp(prefix="tpu_video_")
    if "wan" not in a.skip:
        if not os.path.exists(os.path.join(a.folder, "model_index.json")):
            env = dict(os.environ, JAX_PLATFORMS="cpu")   # the chip stays free
            wall, rc, _, err = run([sys.executable, "-m", "ditax.recipes.random_pipeline",
                                    "--preset", "wan2.1-t2v-1.3b", "--out", a.folder,
                                    "--text-layers", str(a.text_layers)], a.timeout, env)
            emit(a.out, {"bench": "tpu_video", "case": "random Wan 1.3B folder", "metric":
                         "write", "unit": "s", **({"error": err} if rc else
                                                  {"value": round(wall, 1)})})
            if rc:
                return
        cache = os.path.join(work, "cache-wan")
        for mode in ("cold", "warm"):
            video = a.video if (mode == "warm" and a.video) else os.path.join(work, "w.mp4")
            emit(a.out, {**generate(a, a.folder, size, mode, cache, video),
                         "text_layers": a.text_layers})
    if "demo" not in a.skip:
        cache = os.path.join(work, "cache-demo")
        for mode in ("cold", "warm"):
            emit(a.out, generate(a, None, None, mode, cache, os.path.join(work, "d.mp4")))


if __name__ == "__main__":
    main()
