"""Quality of block-sparse attention on the demo model (issue 58 item 4): JSON lines.

    python benchmarks/sparse_quality.py [--seeds 1000,1001] [--cases all] [--vsa-folder DIR]
                                        [--batch 8] [--out docs/sparse_quality.jsonl]
    python benchmarks/sparse_quality.py --table docs/sparse_quality.jsonl   # the markdown table
    python benchmarks/sparse_quality.py --summary docs/sparse_quality.jsonl # re-summarize

The shipped demo model (``ditax.demo.model_path()``, sampled as ``ditax.demo.SAMPLE``: 25 UniPC
steps, guidance 8, 64x64x17 — a 5 x 4 x 4 grid of latent tokens) over the 40 combinations x
``--seeds`` (seeds no training drew), per case of :data:`CASES`: the dense model (``xla``, the
reference), the dense model through the splash kernel with every block kept (``full``: what the
kernel alone changes), sliding-tile (STA) and radial tables at each density the grid allows,
and VSA (``topk`` of the 20 tiles) with its gates at zero (training-free) and fine-tuned
(``--vsa-folder``: ``benchmarks/sparse_finetune.py``'s folder), and the control of that
fine-tune: the same fine-tune run dense (``--dense-ft-folder``: ``sparse_finetune.py --topk
0``); a case whose folder is not given is skipped. Tiles are ``1 x 2 x 2`` tokens (20 tiles:
one latent frame, a quarter of its tokens each); every sparsity keeps all of its steps sparse
(``dense_steps`` 0).

Each video is scored (:mod:`ditax.synthetic.score`: colour, shape, direction, all three) and
compared with the dense video of the same prompt and seed (same noise): PSNR. Lines:

- ``metric: seed_videos``, one per case and seed as it finishes: per video (the 40
  combinations in :func:`~ditax.synthetic.vocab.all_combinations` order) ``correct`` ('1' = all
  three right), each attribute's string and ``psnr`` — :func:`summarize` rebuilds everything
  from these;
- per case (:func:`summarize`): ``density`` (the share of attention scores computed:
  :func:`~ditax.attention.sparse.layout.attention_density`), ``score`` (% of videos with all
  three attributes right), ``vs_dense`` (points, paired video by video with the dense model's
  videos: ``(gained - lost) / videos``) with ``ci95`` (the paired standard error's 95%
  half-width), ``psnr_mean`` / ``psnr_min`` (dB against the dense video), and each attribute's
  accuracy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

BENCH = "sparse_quality"
GRID = (5, 4, 4)            # the demo's latent tokens: 17 frames / 4 + 1, 64 px / 4 / 4 (x2)
TILE = (1, 2, 2)
TOPK = 8                    # VSA: 8 of 20 tiles, 46% of dense with the pooled pass
ATTRS = ("colour", "shape", "direction")
SPLASH = dict(backend="splash", tile=TILE)
#: (case, attention settings, the fine-tuned folder it runs: None (the demo model), vsa, dense)
CASES = (
    ("dense", dict(), None),
    ("full_splash", dict(SPLASH, sparsity="full"), None),
    ("sta_3x3x3", dict(SPLASH, sparsity="sliding_tile", window=(3, 3, 3)), None),
    ("sta_3x3x1", dict(SPLASH, sparsity="sliding_tile", window=(3, 3, 1)), None),
    ("sta_3x1x1", dict(SPLASH, sparsity="sliding_tile", window=(3, 1, 1)), None),
    ("radial_1", dict(SPLASH, sparsity="radial", decay=1.0), None),
    ("radial_0.1", dict(SPLASH, sparsity="radial", decay=0.1), None),
    ("vsa_zero_gates", dict(sparsity="vsa", tile=TILE, topk=TOPK), None),
    ("vsa_finetuned", dict(sparsity="vsa", tile=TILE, topk=TOPK), "vsa"),
    ("dense_finetuned", dict(), "dense"),
)


def attention_config(settings: dict):
    from ditax.config import AttentionConfig

    return AttentionConfig(**settings)


def case_density(settings: dict, grid=GRID) -> float:
    """The share of dense attention's scores ``settings`` compute on ``grid``."""
    from ditax.attention.sparse.layout import attention_density

    return attention_density(attention_config(settings), grid)


def psnr(video, ref) -> float | None:
    """dB of ``video`` against ``ref`` (values in [0, 1]); None when identical."""
    from speed_cache import psnr as _psnr

    return _psnr(video, ref)


def paired(cor: str, ref: str) -> dict:
    """``cor`` against ``ref`` ('1' = right), video by video: gained, lost, the score
    difference in points and its 95% half-width (the paired standard error)."""
    n = len(cor)
    gained = sum(a == "1" and b == "0" for a, b in zip(cor, ref))
    lost = sum(a == "0" and b == "1" for a, b in zip(cor, ref))
    se = 100 * max(gained + lost - (gained - lost) ** 2 / n, 0.0) ** 0.5 / n
    return dict(gained=gained, lost=lost, vs_dense=round(100 * (gained - lost) / n, 2),
                ci95=round(1.96 * se, 2))


def seed_line(case: str, settings: dict, seed: int, scores: list, psnrs: list,
              seconds: float) -> dict:
    """The ``seed_videos`` line of one case and seed."""
    def bits(key):
        return "".join("1" if s[key] else "0" for s in scores)
    return {"bench": BENCH, "case": case, "metric": "seed_videos", "value": len(scores),
            "unit": "videos", "seed": seed, "attention": _jsonable(settings),
            "seconds": round(seconds, 1), "correct": bits("all_correct"),
            **{f"{k}_correct": bits(f"{k}_correct") for k in ATTRS},
            "psnr": [None if p is None else round(p, 2) for p in psnrs]}


def _jsonable(settings: dict) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in settings.items()}


def summarize(lines: list[dict]) -> list[dict]:
    """Per case, the metric lines (module docstring) from its ``seed_videos`` lines, over the
    seeds the dense case has too (the latest line of a case and seed wins)."""
    by = {}
    for ln in lines:
        if ln.get("metric") == "seed_videos":
            by.setdefault(ln["case"], {})[ln["seed"]] = ln
    ref = by.get("dense", {})
    out = []
    for case, rows in by.items():
        seeds = sorted(s for s in rows if s in ref)
        if not seeds:
            continue
        first = rows[seeds[0]]
        cor = "".join(rows[s]["correct"] for s in seeds)
        n = len(cor)
        extra = dict(attention=first["attention"], seeds=seeds, videos=n,
                     **{k: first[k] for k in ("folder", "finetune") if k in first})

        def emit(metric, value, unit, **more):
            out.append({"bench": BENCH, "case": case, "metric": metric, "value": value,
                        "unit": unit, **extra, **more})
        emit("density", round(case_density(_settings(first["attention"])), 4), "fraction")
        emit("score", round(100 * cor.count("1") / n, 2), "%",
             per_seed=[round(100 * rows[s]["correct"].count("1") / len(rows[s]["correct"]), 2)
                       for s in seeds], one_video=round(100 / n, 2))
        for k in ATTRS:
            emit(f"{k}_accuracy", round("".join(rows[s][f"{k}_correct"] for s in seeds)
                                        .count("1") / n, 4), "fraction")
        if case == "dense":
            continue
        p = paired(cor, "".join(ref[s]["correct"] for s in seeds))
        emit("vs_dense", p["vs_dense"], "points", ci95=p["ci95"], gained=p["gained"],
             lost=p["lost"])
        ps = [v for s in seeds for v in rows[s]["psnr"]]
        finite = [v for v in ps if v is not None]
        # None: every video identical to the dense one (infinite PSNR)
        emit("psnr_mean", round(statistics.mean(finite), 2) if finite else None, "dB",
             identical_videos=len(ps) - len(finite))
        emit("psnr_min", round(min(finite), 2) if finite else None, "dB")
    return out


def _settings(attention: dict) -> dict:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in attention.items()}


def table(lines: list[dict]) -> str:
    """The markdown table of the metric lines of :func:`summarize`."""
    by = {}
    for ln in lines:
        by.setdefault(ln["case"], {})[ln["metric"]] = ln
    rows = ["| case | attention | density | score % (per seed) | vs dense ± 95% (gained / "
            "lost) | colour / shape / direction | PSNR dB mean (min) |",
            "|---|---|---|---|---|---|---|"]
    for case, m in by.items():
        a = m["score"]["attention"]
        what = ", ".join(f"{k}={','.join(map(str, v)) if isinstance(v, list) else v}"
                         for k, v in a.items()) or "xla"
        vs = m.get("vs_dense")
        vs = (f"{vs['value']:+.1f} ± {vs['ci95']:.1f} ({vs['gained']} / {vs['lost']})"
              if vs else "—")
        ps = ("—" if "psnr_mean" not in m else "identical" if m["psnr_mean"]["value"] is None
              else f"{m['psnr_mean']['value']:.1f} ({m['psnr_min']['value']:.1f})")
        per = " / ".join(f"{v:g}" for v in m["score"]["per_seed"])
        acc = " / ".join(f"{m[f'{k}_accuracy']['value']:.2f}" for k in ATTRS)
        rows.append(f"| {case} | {what} | {100 * m['density']['value']:.0f}% | "
                    f"{m['score']['value']:.1f} ({per}) | {vs} | {acc} | {ps} |")
    return "\n".join(rows)


def run(seeds, cases, folders=None, out=None, batch: int = 8, combos: int = 0,
        steps: int = 0, tag: str = "") -> list[dict]:
    """Every case in ``cases`` (``dense`` always: the reference) per seed (all cases of a seed,
    then the next: an interrupted run keeps whole seeds; ``folders``: the fine-tuned folders
    by kind, ``vsa`` / ``dense``; ``tag``: a suffix of their cases' names, to tell fine-tunes
    apart in one file); prints and appends (``out``) each
    line as it is made, then the summaries. ``combos`` / ``steps`` (smoke runs): the first
    ``combos`` combinations only, ``steps`` sampler steps (0: all 40, SAMPLE's)."""
    import ditax
    from ditax.demo import SAMPLE, model_path
    from ditax.synthetic.score import score
    from ditax.synthetic.vocab import all_combinations
    from quant_quality import _videos, emit_line

    prompts = [c.prompt for c in all_combinations()][:combos or None]
    sample = dict(SAMPLE, num_inference_steps=steps or SAMPLE["num_inference_steps"])
    chosen = [c for c in CASES if (c[0] == "dense" or c[0] in cases) and
              (c[2] is None or (folders or {}).get(c[2]))]
    folders = {k: v for k, v in (folders or {}).items() if v}
    records = {}
    for kind, folder in folders.items():
        rec = os.path.join(folder, "..", "finetune.json")
        if os.path.isfile(rec):
            with open(rec) as f:
                records[kind] = json.load(f)
    lines = []

    pipes = {}
    for name, settings, tuned in chosen:
        pipes[name] = ditax.load_pipeline(folders[tuned] if tuned else model_path(),
                                          attention=attention_config(settings))
        # the batch's text rows are encoded at the pipeline's length: SAMPLE's, as one call
        pipes[name].max_sequence_length = SAMPLE["max_sequence_length"]
    for seed in seeds:
        ref = None
        for name, settings, tuned in chosen:
            t0 = time.perf_counter()
            videos = _videos(pipes[name], prompts, seed, sample, batch)
            scores = [score(v, p) for v, p in zip(videos, prompts)]
            ref = videos if name == "dense" else ref
            shown = f"{name}_{tag}" if tuned and tag else name
            line = seed_line(shown, settings, seed, scores,
                             [psnr(v, r) for v, r in zip(videos, ref)],
                             time.perf_counter() - t0)
            if tuned:
                line.update(folder=str(folders[tuned]), finetune=records.get(tuned))
            if combos or steps:
                line.update(sample=sample)
            lines.append(line)
            emit_line(line, out)
    summary = summarize(lines)
    for line in summary:
        emit_line(line, out)
    return summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="1000,1001")
    p.add_argument("--cases", default="all", help="comma-separated names of CASES, or all")
    p.add_argument("--vsa-folder", default=None, help="sparse_finetune.py's OUT/folder")
    p.add_argument("--dense-ft-folder", default=None,
                   help="sparse_finetune.py --topk 0's OUT/folder (the control)")
    p.add_argument("--tag", default="", help="suffix of the fine-tuned cases' names")
    p.add_argument("--summary", default=None, metavar="JSONL",
                   help="rewrite this file as its seed lines then their summaries, and exit")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--out", default=None, help="also append the JSON lines to this file")
    p.add_argument("--combos", type=int, default=0, help="smoke: the first N combinations")
    p.add_argument("--steps", type=int, default=0, help="smoke: this many sampler steps")
    p.add_argument("--table", default=None, metavar="JSONL",
                   help="print the markdown table of the seed lines in this file and exit")
    a = p.parse_args(argv)
    if a.table or a.summary:
        with open(a.table or a.summary) as f:
            lines = [json.loads(ln) for ln in f if ln.strip()]
        if a.table:
            print(table(summarize(lines)))
            return 0
        seeds = [ln for ln in lines if ln.get("metric") == "seed_videos"]
        with open(a.summary, "w") as f:
            f.writelines(json.dumps(ln) + "\n" for ln in seeds + summarize(seeds))
        return 0
    cases = [c[0] for c in CASES] if a.cases == "all" else a.cases.split(",")
    unknown = set(cases) - {c[0] for c in CASES}
    if unknown:
        p.error(f"unknown case(s) {sorted(unknown)}; the cases: "
                f"{', '.join(c[0] for c in CASES)}")
    run([int(s) for s in a.seeds.split(",")], cases,
        {"vsa": a.vsa_folder, "dense": a.dense_ft_folder}, a.out, a.batch, a.combos, a.steps,
        a.tag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
