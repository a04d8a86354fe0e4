"""FLUX.1 benchmark (CPU, float32), one JSON object per line.

1. ``transformer``: the forward of ditax's Flux transformer vs diffusers'
   ``FluxTransformer2DModel`` with the same random weights (a diffusers folder loaded by
   ``ditax.load_transformer``), median of ``--repeats`` warm calls each, their ratio
   (diffusers / ditax: > 1 = ditax faster) and the largest difference of the outputs;
   default a reduced-width config (``--width`` D = heads x 128, ``--layers`` double and
   single blocks, ``--size`` pixels: (size/16)² image tokens, ``--text`` T5 tokens).
2. ``pipeline``: per phase (load, text, denoise, decode; ditax cold = with its compile, and
   warm) of ``ditax.load_pipeline`` vs diffusers' ``FluxPipeline`` on the tests' tiny random
   dev-style folder (tests/refs/flux_reference.py), true CFG included, from the same latents.
3. ``plan``: the numbers of ``ditax plan --json`` outputs given with ``--plan FILE`` (e.g.
   docs/flux_plan_v5p8_26.json), per program: peak / arguments / temp GiB, relayout copies,
   collectives, dot FLOPs, roofline — beside maxdiffusion's FLUX.1-dev train step on
   v5p-8 where it is the train step (issue 26's figures).

    python benchmarks/flux.py [--repeats 5] [--width 768] [--layers 2] [--size 256]
                              [--text 128] [--skip transformer,pipeline] [--plan FILE ...]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("DITAX_CACHE_DIR", "none")   # a cold first call

from pipeline import emit, phase_timer  # noqa: E402  (benchmarks/pipeline.py, this folder)

GIB = 2 ** 30
#: maxdiffusion's FLUX.1-dev train step at 1024², global batch 8, fsdp 4 on v5p-8, compiled
#: deviceless the same way (issue 26: per chip per step); its peak is its own measure,
#: arguments + temporaries + outputs - aliased (``ma_peak_gib`` of a ditax row)
MAXDIFFUSION_V5P8 = dict(peak_gib=37.3, ma_peak_gib=37.3, argument_gib=16.8, temp_gib=20.5,
                         dot_tflop=590,
                         copy_gib=118, copy_ops=2340, all_gather_gib=46.9,
                         reduce_scatter_gib=22.1, roofline_s=1.29, published_step_s=1.769)


def _median_s(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_transformer(args):
    import jax
    import numpy as np
    import torch

    import ditax
    from flux_reference import flux_inputs, make_diffusers_flux

    torch.set_num_threads(args.threads)
    heads = args.width // 128
    cfg = dict(patch_size=1, in_channels=64, num_layers=args.layers,
               num_single_layers=args.layers, attention_head_dim=128,
               num_attention_heads=heads, joint_attention_dim=4096, pooled_projection_dim=768,
               guidance_embeds=True, axes_dims_rope=[16, 56, 56])
    m, folder = make_diffusers_flux(pathlib.Path(tempfile.mkdtemp()), seed=0, **cfg)
    image = (args.size // 16) ** 2
    inputs = flux_inputs(np.random.default_rng(0), cfg, b=1, image=image, text=args.text,
                         guidance=True)
    tr = ditax.load_transformer(folder)
    t0 = time.perf_counter()
    out = np.asarray(jax.block_until_ready(tr(**inputs)))
    first = time.perf_counter() - t0
    ours = _median_s(lambda: jax.block_until_ready(tr(**inputs)), args.repeats)
    ti = {k: torch.from_numpy(v) for k, v in inputs.items()}
    with torch.no_grad():
        ref = m(**ti, return_dict=False)[0].numpy()
        theirs = _median_s(lambda: m(**ti, return_dict=False), args.repeats)
    emit(bench="flux", case=f"transformer D={args.width} {args.layers}+{args.layers} blocks, "
         f"{image} image + {args.text} text tokens, guidance", metric="forward_s",
         value=round(ours, 4), unit="s", baseline=round(theirs, 4),
         baseline_name=f"diffusers FluxTransformer2DModel (torch {torch.__version__}, "
         f"{args.threads} threads)", ratio=round(theirs / ours, 3),
         compile_plus_first_s=round(first - ours, 3), repeats=args.repeats,
         max_abs_diff=float(np.abs(out - ref).max()), ref_max_abs=float(np.abs(ref).max()))


def bench_pipeline(args):
    import numpy as np
    import torch

    import ditax
    from flux_reference import make_tiny_flux_pipeline

    torch.set_num_threads(args.threads)
    ref, folder = make_tiny_flux_pipeline(pathlib.Path(tempfile.mkdtemp()),
                                          guidance_embeds=True)
    req = dict(height=args.pipe_size, width=args.pipe_size, num_inference_steps=args.steps,
               guidance_scale=3.5, negative_prompt="blurry", true_cfg_scale=2.0,
               max_sequence_length=64)
    t0 = time.perf_counter()
    pipe = ditax.load_pipeline(folder)
    t_load = time.perf_counter() - t0
    lat = np.random.default_rng(0).standard_normal(
        pipe.packed_shape(args.pipe_size, args.pipe_size)).astype(np.float32)
    prompt = "a cat walks on the grass in the sun"
    pipe(prompt, latents=lat, progress=False, **req)
    cold = pipe.timings
    ours = pipe(prompt, latents=lat, progress=False, **req)
    warm = pipe.timings

    import diffusers

    t0 = time.perf_counter()
    theirs_pipe = diffusers.FluxPipeline.from_pretrained(folder)
    theirs_pipe.set_progress_bar_config(disable=True)
    d_load = time.perf_counter() - t0
    spent = {"text": 0.0, "decode": 0.0}

    timed = phase_timer(spent)
    theirs_pipe.encode_prompt = timed(theirs_pipe.encode_prompt, "text")
    theirs_pipe.vae.decode = timed(theirs_pipe.vae.decode, "decode")
    with torch.no_grad():
        s = time.perf_counter()
        theirs = theirs_pipe(prompt, latents=torch.from_numpy(lat), output_type="np",
                             **req).images[0]
        total = time.perf_counter() - s
    d = {"load": d_load, "text": spent["text"], "decode": spent["decode"],
         "denoise": total - spent["text"] - spent["decode"]}
    case = (f"pipeline tiny dev folder {args.pipe_size}x{args.pipe_size}, {args.steps} steps, "
            f"true CFG")
    del ref
    for phase in ("load", "text", "denoise", "decode"):
        w = t_load if phase == "load" else getattr(warm, phase)
        c = t_load if phase == "load" else getattr(cold, phase)
        emit(bench="flux", case=case, metric=f"{phase}_s", value=round(w, 4), cold=round(c, 4),
             unit="s", baseline=round(d[phase], 4), ratio=round(d[phase] / max(w, 1e-9), 3),
             baseline_name="diffusers FluxPipeline (torch CPU)")
    emit(bench="flux", case=case, metric="compile_s", value=round(cold.compile, 4), unit="s",
         note="the first call's ahead-of-time compile (step + decode); 0 when warm")
    emit(bench="flux", case=case, metric="max_abs_diff_vs_diffusers",
         value=float(np.abs(ours - theirs).max()), unit="")


def _program_row(name: str, prog: dict) -> dict:
    coll = prog.get("collective_bytes", {})
    # peak_gib: XLA's peak_memory_in_bytes (its simulation of the live buffers); ma_peak_gib:
    # maxdiffusion's measure of the same compiled program, arguments + temporaries + outputs
    # - aliased (the sizes of the allocations, summed; the number to hold beside its 37.3)
    ma = (prog["argument_bytes"] + prog["temp_bytes"] + prog["output_bytes"]
          - prog["alias_bytes"])
    row = dict(peak_gib=prog["peak_bytes"] / GIB, ma_peak_gib=ma / GIB,
               argument_gib=prog["argument_bytes"] / GIB,
               temp_gib=prog["temp_bytes"] / GIB, copy_gib=prog["copy_bytes"] / GIB,
               copy_ops=prog["copy_ops"], dot_tflop=prog["flops"] / 1e12,
               xla_dot_tflop=prog["xla_flops"] / 1e12,
               all_gather_gib=coll.get("all-gather", 0) / GIB,
               reduce_scatter_gib=coll.get("reduce-scatter", 0) / GIB,
               roofline_s=prog.get("roofline", {}).get("estimate_s"),
               compile_s=prog.get("compile_s"))
    return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}


def bench_plan(paths):
    for path in paths:
        plan = json.loads(pathlib.Path(path).read_text())
        for name in ("forward", "train_step"):
            if name not in plan:
                continue
            prog = plan[name]
            if prog.get("fits") is False and "error" in prog:
                emit(bench="flux", case=f"plan {path} {name}", metric="fits", value=False,
                     error=prog["error"])
                continue
            row = _program_row(name, prog)
            extra = ({"maxdiffusion": MAXDIFFUSION_V5P8}
                     if name == "train_step" and plan.get("target") == "tpu-v5p-8" else {})
            emit(bench="flux", case=f"plan {plan.get('target')} {name} "
                 f"{' '.join(plan.get('overrides', []))}".strip(), metric="per_chip",
                 value=row, mesh=plan.get("mesh"), source=str(path), **extra)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--width", type=int, default=768, help="transformer width (heads x 128)")
    p.add_argument("--layers", type=int, default=2, help="double and single blocks each")
    p.add_argument("--size", type=int, default=256, help="image pixels (tokens: (size/16)²)")
    p.add_argument("--text", type=int, default=128, help="T5 text tokens")
    p.add_argument("--steps", type=int, default=4, help="pipeline steps")
    p.add_argument("--pipe-size", type=int, default=64, help="pipeline image pixels")
    p.add_argument("--skip", default="", help="comma list of transformer, pipeline")
    p.add_argument("--plan", nargs="*", default=[], help="ditax plan --json output files")
    args = p.parse_args()
    if args.width % 128 or args.width < 128:
        p.error(f"--width {args.width} must be a multiple of 128 (heads x 128)")
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "refs"))
    skip = {s for s in args.skip.split(",") if s}
    if "transformer" not in skip:
        bench_transformer(args)
    if "pipeline" not in skip:
        bench_pipeline(args)
    bench_plan(args.plan)
    return 0


if __name__ == "__main__":
    sys.exit(main())
