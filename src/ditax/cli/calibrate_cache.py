"""``ditax calibrate-cache MODEL --prompts "..." "..." [--output numbers.json]``: measure the
step-cache numbers of a pipeline folder (TeaCache polynomial, MagCache ratios).

Generates each prompt with every step computed, measures per step and CFG branch how the
timestep-modulated input, the output and the blocks' residual change
(:mod:`ditax.pipelines.calibrate`), and writes one numbers entry as JSON. Use it with
``ditax generate ... sample.cache=teacache sample.cache_coefficients=numbers.json`` or
``pipe(..., cache="magcache", cache_coefficients="numbers.json")``; append the entry to
``src/ditax/pipelines/step_cache_numbers.json`` to make it the model's default.

Sizes, steps and guidance default to the ``sample`` config (``--steps`` / sizes as in
``ditax generate``); calibrate with the settings you will sample with (the ratios are per step).
"""

from __future__ import annotations

import argparse
import pathlib

from ditax.cli import request_errors
from ditax.errors import RequestError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="pipeline folder (model_index.json) or hub id")
    p.add_argument("--prompts", nargs="+", required=True, help="prompts to generate (2-8)")
    p.add_argument("--negative-prompt", default=None)
    p.add_argument("--height", type=int, default=None)
    p.add_argument("--width", type=int, default=None)
    p.add_argument("--frames", type=int, default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--guidance", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--name", default=None, help="entry name (default: the folder's name)")
    p.add_argument("--teacache-input", choices=("modulation", "time_embedding"),
                   default="modulation", help="what TeaCache compares between steps")
    p.add_argument("--output", default="cache_numbers.json", help="JSON file to write")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("overrides", nargs="*", default=[], metavar="key=value",
                   help="config overrides (model.dtype, attention.*, mesh.*, sample.*)")


def run(args) -> int:
    import jax

    import ditax
    from ditax.attention.te import entry_context
    from ditax.cli.generate import check_model_and_attention
    from ditax.compile_cache import compile_cache
    from ditax.config import load_config, parse_overrides, validate
    from ditax.pipelines.calibrate import calibrate
    from ditax.pipelines.cache_numbers import write_numbers
    from ditax.pipelines.request import check_request

    cfg = load_config(None, args.overrides)
    given = parse_overrides(args.overrides)
    s = cfg.sample
    pick = lambda a, d: d if a is None else a   # noqa: E731
    req = dict(height=pick(args.height, s.height), width=pick(args.width, s.width),
               num_frames=pick(args.frames, s.num_frames),
               num_inference_steps=pick(args.steps, s.num_inference_steps),
               guidance_scale=pick(args.guidance, s.guidance_scale))
    with request_errors():
        for prompt in args.prompts:
            check_request(prompt, req["height"], req["width"], req["num_frames"],
                          req["num_inference_steps"], req["guidance_scale"], None,
                          args.negative_prompt)
    if req["num_inference_steps"] < 3:
        raise RequestError(f"--steps={req['num_inference_steps']}: calibration needs >= 3 steps")
    if pathlib.Path(args.output).suffix.lower() != ".json":
        raise RequestError(f"--output {args.output!r} must end in .json")
    use_mesh = "mesh" in given
    validate(cfg, jax.device_count() if use_mesh else None)
    mesh = ditax.make_mesh(cfg.mesh) if use_mesh else None
    load = dict(path=args.model, dtype=cfg.model.dtype, attention=cfg.attention)
    check_model_and_attention(load, mesh)
    with entry_context(cfg.attention, mesh), compile_cache(cfg.compile_cache):
        pipe = ditax.load_pipeline(args.model, dtype=cfg.model.dtype, mesh=mesh,
                                   attention=cfg.attention, cfg_mode=s.cfg_mode,
                                   flow_shift=s.flow_shift,
                                   max_sequence_length=s.max_sequence_length,
                                   scheduler=(s.scheduler if "scheduler" in given.get("sample", {})
                                              else None))
        with request_errors():
            entry = calibrate(pipe, list(args.prompts), negative_prompt=args.negative_prompt,
                              name=args.name or pathlib.Path(str(args.model)).name, seed=args.seed,
                              teacache_input=args.teacache_input,
                              progress=not args.no_progress, **req)
    path = write_numbers(args.output, entry)
    mag = entry["magcache"]["ratios"]
    print(f"teacache ({args.teacache_input}): coefficients {entry['teacache']['coefficients']}")
    print(f"magcache: ratios cond {mag[0]}")
    print(f"wrote {path}; use it with sample.cache_coefficients={path}")
    return 0
