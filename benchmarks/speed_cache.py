"""The step-cache parts of ``benchmarks/speed.py`` (run that script; see its docstring):

- :func:`step_cache`: each method x threshold (and CFG reuse) on a model, vs its uncached
  videos: transformer calls, denoise time and speed-up, PSNR / SSIM, the demo's prompt score;
- :func:`published`: the shipped (published) Wan 2.1 T2V 1.3B TeaCache / MagCache numbers on a
  random-weights transformer of Wan 1.3B's width (D 1536, 12 heads of 128, FFN 8960; a few
  blocks so a CPU can run it) inside the demo-size pipeline: the same calls / PSNR;
- :func:`plot`: speed-up vs PSNR per method (PNG).

JSON objects, one a line, on stdout (:func:`emit`).
"""

from __future__ import annotations

import json
import math
import pathlib
import time

import numpy as np

PROMPT = "a cat walks on the grass in the sun"
NEGATIVE = "blurry, low quality"


def emit(**kw):
    print(json.dumps(kw), flush=True)


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
    """Prompts of combinations the demo model was trained on (as ``calibrate-cache demo``)."""
    from ditax.cli.calibrate_cache import demo_prompts as prompts

    return prompts(n)


def step_cache(folder, args, work: pathlib.Path) -> None:
    """Part 2: each method x threshold (and CFG reuse) vs the uncached videos."""
    import ditax
    from ditax.pipelines.cache.numbers import find_numbers, write_numbers
    from ditax.pipelines.cache.calibrate import calibrate

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
        from ditax.synthetic.score import score

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


# Wan 2.1 T2V 1.3B's width (diffusers WanTransformer3DModel fields); the block count is ours
WAN13B_WIDTH = dict(num_attention_heads=12, attention_head_dim=128, ffn_dim=8960, freq_dim=256)
PUBLISHED = "wan2.1-t2v-1.3b"      # the shipped entry whose numbers are tried


def wide_transformer(like, layers: int, seed: int = 0):
    """A random-weights transformer of Wan 2.1 1.3B's width with ``layers`` blocks that reads
    the latents and text of the transformer config ``like`` (patch 1x2x2 as Wan)."""
    from ditax.config import ModelConfig
    from ditax.demo.folders import TRANSFORMER
    from ditax.models.wan.build import init_model
    from ditax.models.wan.loading import Transformer

    cfg = ModelConfig.from_diffusers(dict(
        TRANSFORMER, **WAN13B_WIDTH, num_layers=layers, in_channels=like.in_channels,
        out_channels=like.out_channels, text_dim=like.text_dim))
    return Transformer(init_model(cfg, seed=seed))


def published_numbers(config, path: pathlib.Path) -> pathlib.Path:
    """The shipped :data:`PUBLISHED` entry, re-matched to ``config`` (same width, fewer blocks:
    the shipped file alone would not apply it) and written to ``path``."""
    from ditax.pipelines.cache.numbers import SHIPPED, match_of, read_numbers, write_numbers

    entry = next(e for e in read_numbers(SHIPPED) if e["name"] == PUBLISHED)
    return write_numbers(path, dict(entry, match=match_of(config),
                                    name=f"{PUBLISHED} on {config.num_layers} random blocks"))


def published(folder, args, work: pathlib.Path) -> None:
    """Part 3: the published Wan 2.1 1.3B TeaCache / MagCache numbers at each threshold on a
    random 1.3B-width model: transformer calls, denoise time and PSNR / SSIM vs uncached (one
    prompt and noise; each method compiled untimed first)."""
    import ditax

    pipe = ditax.load_pipeline(folder)
    pipe.compile_cache = "none"
    pipe.transformer = wide_transformer(pipe.transformer.config, args.wide_layers)
    cfg = pipe.transformer.config
    numbers = published_numbers(cfg, work / "published.json")
    req = dict(prompt=PROMPT, negative_prompt=NEGATIVE, height=args.height, width=args.width,
               num_frames=args.frames, num_inference_steps=args.wide_steps, guidance_scale=5.0,
               seed=0, progress=False)
    case = (f"random Wan 1.3B-width transformer (D {cfg.inner_dim}, {cfg.num_attention_heads} "
            f"heads, FFN {cfg.ffn_dim}, {cfg.num_layers} blocks), {args.frames}x{args.height}x"
            f"{args.width}, {args.wide_steps} steps, CFG, published {PUBLISHED} numbers")
    pipe(**req)                                   # compile, untimed
    base = pipe(**req)
    base_s, base_calls = pipe.timings.denoise, pipe.last_stats["transformer_calls"]
    emit(bench="speed", case=case, metric="published", method="none", threshold=None,
         transformer_calls=base_calls, value=round(base_s, 3), unit="s")
    thresholds = dict(THRESHOLDS, **dict(parse_thresholds(t) for t in args.thresholds))
    for method in ("teacache", "magcache"):
        pipe(cache=method, cache_coefficients=numbers, **req)     # compile, untimed
        for thr in thresholds[method]:
            video = pipe(cache=method, cache_threshold=thr, cache_coefficients=numbers, **req)
            st, secs = pipe.last_stats, pipe.timings.denoise
            q = psnr(video, base)
            emit(bench="speed", case=case, metric="published", method=method, threshold=thr,
                 transformer_calls=st["transformer_calls"], calls_baseline=base_calls,
                 value=round(secs, 3), unit="s", baseline=round(base_s, 3),
                 ratio=round(base_s / secs, 3), psnr_db=None if q is None else round(q, 2),
                 ssim=round(ssim(video, base), 4), skipped_steps=st["skipped_steps"])


def plot(rows: list[dict], path: str, case: str) -> None:
    """PSNR vs speed-up, one line per method through its thresholds: by transformer calls
    (``calls_baseline / transformer_calls``: what the cache saves, machine-independent) and
    by the measured denoise-loop time (``ratio``: noisy where the loop is short or the machine
    busy). Identical videos (PSNR None) are drawn at 100 dB."""
    try:
        import matplotlib
    except ImportError:
        emit(bench="speed", metric="plot", value=None, note="matplotlib missing: pip install "
             "'ditax[bench]'")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    speedups = (("fewer transformer calls vs uncached (x)",
                 lambda r: r["calls_baseline"] / r["transformer_calls"]),
                ("measured denoise-loop speed-up vs uncached (x)", lambda r: r["ratio"]))
    for ax, (xlabel, speedup) in zip(axes, speedups):
        for method in sorted({(r["method"], r["cfg_cache"]) for r in rows}, key=str):
            pts = [(speedup(r), r["psnr_db"] if r["psnr_db"] is not None else 100.0,
                    r["threshold"]) for r in rows if (r["method"], r["cfg_cache"]) == method]
            label = method[0] + (" + cfg_cache" if method[1] and method[0] != "cfg_only"
                                 else "")
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=label)
            for x, y, t in pts:
                if t is not None:
                    ax.annotate(f"{t:g}", (x, y), textcoords="offset points", xytext=(4, 4),
                                fontsize=7)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("PSNR vs uncached video (dB; 100 = identical)")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"step caching: {case}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    emit(bench="speed", metric="plot", value=str(path))


