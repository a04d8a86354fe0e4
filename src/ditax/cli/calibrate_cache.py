"""``ditax calibrate-cache --model MODEL --prompts "..." "..." [--output numbers.json]``: measure
the step-cache numbers of a pipeline folder (TeaCache polynomial, MagCache ratios).

Generates each prompt with every step computed, measures per step and CFG branch how the
timestep-modulated input, the output and the blocks' residual change
(:mod:`ditax.pipelines.cache.calibrate`), and writes one numbers entry as JSON. Use it with
``ditax generate ... sample.cache=teacache sample.cache_coefficients=numbers.json`` or
``pipe(..., cache="magcache", cache_coefficients="numbers.json")``; append the entry to
``src/ditax/pipelines/cache/step_cache_numbers.json`` to make it the model's default.

Sizes, steps and guidance default to the ``sample`` config (``--steps`` / sizes as in
``ditax generate``); calibrate with the settings you will sample with (the ratios are per step).
``--into FILE`` puts the entry into an existing numbers file instead (replacing the entry of the
same name or model): ``--into src/ditax/pipelines/cache/step_cache_numbers.json`` ships it.

A folder's ``ditax_sample.json`` (:mod:`ditax.pipelines.sample_defaults`) gives the defaults of
the sizes, steps, guidance and negative prompt, as for ``ditax generate``. A folder whose family
has no step cache (its spec declares no capability ``step_cache``; FLUX.1 today) is
refused in one line (exit 2) before anything loads.
``MODEL`` = ``demo``: the shipped demo model (sampled as its ``ditax_sample.json`` says),
prompts of its vocabulary unless ``--prompts`` are given, entry name ``ditax-demo``; its shipped
numbers are regenerated with ``ditax calibrate-cache --model demo --into
src/ditax/pipelines/cache/step_cache_numbers.json``.
"""

from __future__ import annotations

import argparse
import pathlib

from ditax.cli import request_errors
from ditax.errors import RequestError


DEMO_NAME = "ditax-demo"
DEMO_PROMPTS = 4      # calibration prompts of the demo's vocabulary (seen combinations)
MIN_PROMPTS, MAX_PROMPTS = 2, 8   # enough to average the ratios over; each is a full generation


def demo_prompts(n: int = DEMO_PROMPTS) -> list[str]:
    """The first ``n`` prompts of combinations the demo model was trained on."""
    from ditax.synthetic.vocab import canonical_prompt, seen_combinations

    return [canonical_prompt(c.colour, c.shape, c.direction) for c in seen_combinations()[:n]]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="pipeline folder (model_index.json), hub "
                   "id, or 'demo' (the shipped demo model); a folder's ditax_sample.json gives "
                   "the defaults of the size, steps and guidance flags")
    p.add_argument("--prompts", nargs="+", default=None,
                   help="prompts to generate (2-8; required unless MODEL is demo)")
    p.add_argument("--negative-prompt", default=None)
    p.add_argument("--height", type=int, default=None)
    p.add_argument("--width", type=int, default=None)
    p.add_argument("--frames", type=int, default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--guidance", type=float, default=None)
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the first prompt (prompt k: SEED + k; all < 2**32)")
    p.add_argument("--image", default=None, metavar="FIRST.png",
                   help="first frame of every prompt (image-to-video folders)")
    p.add_argument("--name", default=None, help="entry name (default: the folder's name)")
    p.add_argument("--teacache-input", choices=("modulation", "time_embedding"),
                   default="modulation", help="what TeaCache compares between steps")
    p.add_argument("--output", default="cache_numbers.json", help="JSON file to write")
    p.add_argument("--into", default=None, metavar="NUMBERS.json",
                   help="put the entry into this existing numbers file (replacing the entry of "
                        "the same name or model) instead of writing --output")
    p.add_argument("--no-progress", action="store_true",
                   help="hide the progress bars and the loading / compiling status line")
    p.add_argument("overrides", nargs="*", default=[], metavar="key=value",
                   help="config overrides (model.dtype, attention.*, mesh.*, sample.*)")


def run(args) -> int:
    import jax

    import ditax
    from ditax.io.images import read_image
    from ditax.front.folder import check_sizes, folder_request
    from ditax.front.run import run_context
    from ditax.models.common.fields import matmul_precision
    from ditax.config import validate
    from ditax.models import registry
    from ditax.pipelines.cache.calibrate import calibrate
    from ditax.pipelines.cache.numbers import merge_numbers, read_numbers, write_numbers
    from ditax.pipelines.family import preflight
    from ditax.pipelines.seeds import check_seed

    name = args.name or pathlib.Path(str(args.model)).name
    if args.model == "demo":          # the shipped demo model (its ditax_sample.json)
        name = args.name or DEMO_NAME
        if args.prompts is None:
            args.prompts = demo_prompts()
    if args.prompts is None:
        raise RequestError(f"--prompts is required ({MIN_PROMPTS}-{MAX_PROMPTS} prompts to "
                           f"generate), unless MODEL is demo")
    if not MIN_PROMPTS <= len(args.prompts) <= MAX_PROMPTS:
        raise RequestError(f"--prompts got {len(args.prompts)} prompt(s); calibration takes "
                           f"{MIN_PROMPTS}-{MAX_PROMPTS} (each is one full generation; the "
                           f"numbers are their mean) — pass between {MIN_PROMPTS} and "
                           f"{MAX_PROMPTS} quoted prompts")
    sr = folder_request(args.model, args.overrides)
    registry.require(           # before any request rule of a family it cannot run
        sr.cfg.model.family, "step_cache", f"calibrate-cache measures step-cache numbers, but "
        f"{sr.model} is a {sr.pipelines.name} folder", "calibrate a folder of a family that "
        "has one (e.g. `ditax calibrate-cache --model demo`)")
    cfg, given, defaults = sr.cfg, sr.given, sr.defaults
    s = cfg.sample
    args.model = sr.model
    pick = lambda a, d: d if a is None else a   # noqa: E731
    req = dict(height=pick(args.height, defaults["height"]),
               width=pick(args.width, defaults["width"]),
               num_frames=pick(args.frames, defaults["num_frames"]),
               num_inference_steps=pick(args.steps, defaults["num_inference_steps"]),
               guidance_scale=pick(args.guidance, defaults["guidance_scale"]))
    negative = pick(args.negative_prompt, defaults["negative_prompt"])
    with request_errors():
        check_seed(args.seed, len(args.prompts), "--seed")
        check_sizes(sr, req)            # the folder's one size rule, as generate / serve
        for prompt in args.prompts:
            sr.pipelines.check_request(prompt, req["height"], req["width"], req["num_frames"],
                                       req["num_inference_steps"], req["guidance_scale"], None,
                                       negative)
    if req["num_inference_steps"] < 3:
        raise RequestError(f"--steps={req['num_inference_steps']}: calibration needs >= 3 steps")
    if pathlib.Path(args.output).suffix.lower() != ".json":
        raise RequestError(f"--output {args.output!r} must end in .json")
    if args.into is None:
        from ditax.io.outputs import check_output_file

        check_output_file(args.output, "--output", "numbers.json")
    if args.into is not None:
        read_numbers(args.into)        # an existing numbers file, before any weights
    use_mesh = "mesh" in given
    validate(cfg, jax.device_count() if use_mesh else None)
    mesh = ditax.make_mesh(cfg.mesh) if use_mesh else None
    load = dict(path=args.model, dtype=cfg.model.dtype, attention=cfg.attention)
    # the folder's family checks it against the request, before weights (a causal student is
    # refused: calibration reads a whole video's final latents, output="latent")
    preflight(args.model, load, {**req, "output": "latent"}, mesh)
    # the family's own options of its call and loader from the sample section (Wan: the flow
    # shift, text length and sampler of its loader; LTX-2: the text length of its call)
    given_sizes = {"height": args.height, "width": args.width, "num_frames": args.frames}
    own_call, own_load = sr.pipelines.sample_options(given_sizes, s, sr.chosen, defaults,
                                                     dict(req))
    with run_context(cfg.attention, mesh, compile_cache=cfg.compile_cache,
                     status=not args.no_progress, precision=matmul_precision(cfg.model)):
        pipe = ditax.load_pipeline(args.model, dtype=cfg.model.dtype, mesh=mesh,
                                   attention=cfg.attention, cfg_mode=s.cfg_mode, **own_load)
        with request_errors():
            image = read_image(args.image, "--image") if args.image is not None else None
            entry = calibrate(pipe, list(args.prompts), negative_prompt=negative, name=name,
                              seed=args.seed,
                              teacache_input=args.teacache_input, image=image,
                              progress=not args.no_progress, **req,
                              **{k: v for k, v in own_call.items() if v is not None})
    path = (write_numbers(args.output, entry) if args.into is None
            else merge_numbers(args.into, entry))
    mag = entry["magcache"]["ratios"]
    print(f"teacache ({args.teacache_input}): coefficients {entry['teacache']['coefficients']}")
    print(f"magcache: ratios cond {mag[0]}")
    print(f"wrote {path}" + (f"; use it with sample.cache_coefficients={path}"
                             if args.into is None else f" (entry {name!r})"))
    return 0
