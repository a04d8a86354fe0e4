"""Demo-model quality per 8-bit mode (``benchmarks/quant.py --quality``): JSON lines.

The shipped demo model (``ditax.demo.model_path()``, sampled as ``ditax.demo.SAMPLE``) per
mode — full precision (float32), int8 W, int8 W+A, fp8 W, fp8 W+A, 8-bit attention
(``sage_xla``: the ``sage`` kernel's numbers), all together — over the 40 combinations x
``seeds``. Each video is scored (:mod:`ditax.synthetic.score`: colour, shape, direction, all
three) and compared with the full-precision video of the same prompt and seed (same noise):
PSNR and SSIM.

Speed: every mode's pipeline is loaded once, and its 40 prompts of one seed run as batches of
``batch`` rows through one compiled step program per mode (:func:`ditax.serve.batch.
generate_batch`: each row's noise is its own seed's draw, so a row equals the pipeline's
single-video call within float rounding of the wider matmuls, ~1e-5 on this model). On this
2-core CPU a batch of 8 was ~1.5x faster per video than one at a time; 40 in one batch was
slower than 8.

Lines (``out`` also appends them to a file: docs/quant_quality.jsonl):

- ``demo_quality_seed``, one per mode and seed as it finishes: the scores, PSNR / SSIM, and
  per video (the 40 combinations in :func:`~ditax.synthetic.vocab.all_combinations` order)
  ``correct`` ('1' = all three attributes right) and ``psnr`` — so :func:`summarize` can
  rebuild the mean line from the file alone.
- ``demo_quality``, one per mode after the last seed (:func:`summarize`): the score over all
  videos, per seed, and against full precision paired video by video (``gained`` / ``lost``:
  videos right only in this mode / only in full precision; the score difference is
  ``(gained - lost) / videos``, ``vs_full_precision_ci95`` its half-width at 95% from the paired
  standard error ``sqrt(gained + lost - (gained - lost)² / n) / n``).
"""

from __future__ import annotations

import json
import statistics
import time
from bench_lines import emit

import numpy as np

QUALITY_MODES = (("none", dict()), ("int8_w", dict(quantize="int8")),
                 ("int8_wa", dict(quantize="int8", quantize_activations=True)),
                 ("fp8_w", dict(quantize="fp8")),
                 ("fp8_wa", dict(quantize="fp8", quantize_activations=True)),
                 ("sage_attention", dict(attention="sage_xla")),
                 ("all", dict(quantize="int8", quantize_activations=True, attention="sage_xla")))
ATTRS = ("colour", "shape", "direction")


def _videos(pipe, prompts, seed: int, sample: dict, batch: int) -> list[np.ndarray]:
    """The videos of ``prompts`` at ``seed``, ``batch`` rows per run of the step program (the
    last run padded to ``batch``, so one program serves every run)."""
    from ditax.serve.batch import generate_batch

    calls = [dict(prompt=p, negative_prompt=sample["negative_prompt"], seed=seed,
                  height=sample["height"], width=sample["width"],
                  num_frames=sample["num_frames"],
                  num_inference_steps=sample["num_inference_steps"],
                  guidance_scale=sample["guidance_scale"], guidance_scale_2=None)
             for p in prompts]
    out = []
    for i in range(0, len(calls), batch):
        out += generate_batch(pipe, calls[i:i + batch], pad_to=batch)
    return out


def _psnr_stats(psnr: list) -> dict:
    finite = [p for p in psnr if p is not None]
    return dict(psnr_db_mean=round(statistics.mean(finite), 2) if finite else None,
                psnr_db_min=round(min(finite), 2) if finite else None,
                identical_videos=len(psnr) - len(finite))


def seed_line(name: str, options: dict, seed: int, scores: list, psnr: list, ssim: list,
              sample: dict, seconds: float) -> dict:
    """The ``demo_quality_seed`` line of one mode and seed (module docstring)."""
    n = len(scores)
    line = {"bench": "quant", "case": "demo_quality_seed", "mode": name, **options,
            "seed": seed, "videos": n, "sample": dict(sample),
            "score_all": round(100 * sum(s["all_correct"] for s in scores) / n, 2),
            **{f"{k}_accuracy": round(sum(s[f"{k}_correct"] for s in scores) / n, 4)
               for k in ATTRS},
            "seconds": round(seconds, 1),
            "correct": "".join("1" if s["all_correct"] else "0" for s in scores)}
    for k in ATTRS:
        line[f"{k}_correct"] = "".join("1" if s[f"{k}_correct"] else "0" for s in scores)
    if name != "none":
        line.update(_psnr_stats(psnr), ssim_mean=round(statistics.mean(ssim), 4),
                    ssim_min=round(min(ssim), 4),
                    psnr=[None if p is None else round(p, 2) for p in psnr],
                    ssim=[round(s, 4) for s in ssim])
    return line


def summarize(lines: list[dict]) -> list[dict]:
    """One ``demo_quality`` line per mode from its ``demo_quality_seed`` lines (the seeds
    present for both the mode and full precision), paired against full precision."""
    by = {}
    for ln in lines:
        if ln.get("case") == "demo_quality_seed":
            by.setdefault(ln["mode"], {})[ln["seed"]] = ln        # the latest line wins
    ref = by.get("none", {})
    out = []
    for name, options in QUALITY_MODES:
        rows = by.get(name)
        if not rows:
            continue
        seeds = sorted(s for s in rows if s in ref)
        if not seeds:
            continue
        cor = "".join(rows[s]["correct"] for s in seeds)
        fp = "".join(ref[s]["correct"] for s in seeds)
        n = len(cor)
        line = {"bench": "quant", "case": "demo_quality", "mode": name, **options,
                "videos": n, "seeds": seeds, "sample": rows[seeds[0]]["sample"],
                "score_all": round(100 * cor.count("1") / n, 2),
                "score_per_seed": [rows[s]["score_all"] for s in seeds],
                **{f"{k}_accuracy": round(sum(rows[s][f"{k}_correct"].count("1")
                                              for s in seeds) / n, 4) for k in ATTRS},
                "one_video_points": round(100 / n, 2),
                "seconds": round(sum(rows[s]["seconds"] for s in seeds), 1)}
        if name != "none":
            gained = sum(a == "1" and b == "0" for a, b in zip(cor, fp))
            lost = sum(a == "0" and b == "1" for a, b in zip(cor, fp))
            psnr = [p for s in seeds for p in rows[s]["psnr"]]
            ssim = [v for s in seeds for v in rows[s]["ssim"]]
            # paired (McNemar) standard error of the score difference, in points
            se = 100 * max(gained + lost - (gained - lost) ** 2 / n, 0.0) ** 0.5 / n
            line.update(vs_full_precision=round(100 * (gained - lost) / n, 2),
                        vs_full_precision_ci95=round(1.96 * se, 2),
                        gained=gained, lost=lost, **_psnr_stats(psnr),
                        psnr_db_mean_per_seed=[rows[s]["psnr_db_mean"] for s in seeds],
                        ssim_mean=round(statistics.mean(ssim), 4), ssim_min=round(min(ssim), 4))
        out.append(line)
    return out


def quality(seeds: int, modes, out=None, batch: int = 8) -> None:
    """Every mode in ``modes`` (full precision always: the reference), seeds ``0..seeds-1``
    one after the other (all modes per seed, so an interrupted run keeps whole seeds);
    prints and appends (``out``) each line as it is made, then the summaries."""
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from speed_cache import psnr, ssim

    import ditax
    from ditax.demo import SAMPLE, model_path
    from ditax.synthetic.score import score
    from ditax.synthetic.vocab import all_combinations

    prompts = [c.prompt for c in all_combinations()]
    chosen = [(n, o) for n, o in QUALITY_MODES if n == "none" or n in modes]
    pipes = {}
    for name, options in chosen:
        pipes[name] = ditax.load_pipeline(model_path(), **options)
        # the batch's text rows are encoded at the pipeline's length: SAMPLE's, as one call
        pipes[name].max_sequence_length = SAMPLE["max_sequence_length"]
    lines = []

    for seed in range(seeds):
        ref = None
        for name, options in chosen:
            t0 = time.perf_counter()
            videos = _videos(pipes[name], prompts, seed, SAMPLE, batch)
            scores = [score(v, p) for v, p in zip(videos, prompts)]
            if name == "none":
                ref, p_, s_ = videos, [], []
            else:
                p_ = [psnr(v, r) for v, r in zip(videos, ref)]
                s_ = [ssim(v, r) for v, r in zip(videos, ref)]
            lines.append(seed_line(name, options, seed, scores, p_, s_, SAMPLE,
                                   time.perf_counter() - t0))
            emit_line(lines[-1], out)
    for line in summarize(lines):
        emit_line(line, out)


def emit_line(line: dict, out=None) -> None:
    """Print ``line`` as JSON and append it to the file ``out`` (None: print only)."""
    emit(line, out)


def summarize_file(path: str) -> None:
    """Print (not append) the summary lines of the seed lines in ``path``."""
    with open(path) as f:
        lines = [json.loads(ln) for ln in f if ln.strip()]
    for line in summarize(lines):
        print(json.dumps(line))


__all__ = ["QUALITY_MODES", "emit_line", "quality", "seed_line", "summarize", "summarize_file"]
