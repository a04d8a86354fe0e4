"""``ditax generate``: prompt → mp4 with a diffusers-format Wan pipeline folder (or hub id),
or → PNG with an image model's folder (FLUX.1 ``FluxPipeline``: ``--output x.png``; the video
flags refused in one line; true CFG with ``--negative-prompt TEXT --true-cfg SCALE``, the
pipeline's ``negative_prompt=`` / ``true_cfg_scale=``).

    ditax generate --model Wan-AI/Wan2.1-T2V-1.3B-Diffusers --prompt "a cat on a skateboard" \\
        --height 480 --width 832 --frames 81 --steps 50 --guidance 5 --output cat.mp4 \\
        model.dtype=bfloat16 attention.backend=ulysses mesh.context=8 sample.cfg_mode=batched
    ditax generate --model Wan-AI/Wan2.2-TI2V-5B-Diffusers --image first.png --prompt "..." \\
        --height 704 --width 1280 --frames 121

Image-to-video folders (``WanImageToVideoPipeline``; ``expand_timesteps`` TI2V) take
``--image FIRST`` (required for I2V, optional for TI2V) and ``--last-image LAST``
(first-last-frame models and Wan 2.2 I2V); a text-to-video folder refuses them. Wan 2.2
Animate folders take ``--image REF --pose-video --face-video`` (:mod:`ditax.cli.animate_flags`).

    # a 4-step distillation LoRA on each Wan 2.2 expert, sampled as it was distilled
    ditax generate --model Wan-AI/Wan2.2-T2V-A14B-Diffusers --prompt "..." \
        --lora high_noise.safetensors --lora-2 low_noise.safetensors sample.preset=lightning-4step

Everything that can be wrong with the request is checked before any weights are read: sizes,
frames, steps, guidance, prompt, ``key=value`` overrides, mesh vs device count, output suffix,
the images (readable, and wanted by the folder's kind), the model folder (its
``model_index.json`` and transformer ``config.json``), the ``--lora``
files (readable, a known format; whether they fit the model is checked as it loads), and
whether the attention backend can run here with the folder's head dim, and the outputs
(``--output`` not a folder, ``--frames-dir`` new or empty, their parents writable). Shows a
status line while loading and compiling and a progress bar over the steps (each step counted
when it has finished on the device; ``--no-progress`` hides both), then one timing line (load,
text, compile, denoise, decode). The mp4 and the PNGs are written beside their names and
renamed at the end: a failed run leaves no half-written file. Sizes, steps, guidance and fps
default to the folder's ``ditax_sample.json``, else its family's (:mod:`ditax.cli.sample_request`).
The checks that need the folder are its family's
(:meth:`~ditax.pipelines.family.PipelineFamily.preflight`, found by ``model_index.json``'s
``_class_name``). An out-of-memory says in which phase and what to lower (exit 1).

Compiled programs are kept in jax's persistent compilation cache (:mod:`ditax.compile_cache`),
so a second run of the same shapes reads them instead of compiling: by default in
``~/.cache/ditax/jax`` (``$XDG_CACHE_HOME``); ``DITAX_CACHE_DIR=PATH`` or ``compile_cache=PATH``
moves it, ``compile_cache=none`` turns it off.

Step caching (:mod:`ditax.pipelines.cache.step_cache`): ``sample.cache=first_block|teacache|magcache``,
``sample.cache_threshold=X`` (default per method), ``sample.cfg_cache=true``,
``sample.cache_coefficients=numbers.json`` (from ``ditax calibrate-cache``); a line after the
timing line reports the transformer calls.
"""

from __future__ import annotations

import argparse
import pathlib
import time

from ditax.cli import request_errors
from ditax.cli.animate_flags import ANIMATE_FLAGS, add_animate_arguments, read_animate
from ditax.errors import ConfigError, RequestError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="pipeline folder (model_index.json), hub id, "
                   "or 'demo' (the shipped demo model); a folder's ditax_sample.json gives "
                   "the defaults of the size, steps and guidance flags")
    p.add_argument("--prompt", required=True)
    p.add_argument("--negative-prompt", default=None)
    p.add_argument("--image", default=None, metavar="FIRST.png",
                   help="first frame (image-to-video folders; optional for Wan 2.2 TI2V)")
    p.add_argument("--last-image", default=None, metavar="LAST.png",
                   help="last frame (first-last-frame models, Wan 2.2 I2V A14B)")
    p.add_argument("--video", default=None, metavar="IN.mp4",
                   help="source video: video-to-video with --strength (text-to-video folders)")
    p.add_argument("--strength", type=float, default=None,
                   help="video-to-video: how much of the schedule runs, in (0, 1] (0.7)")
    p.add_argument("--mask", default=None, metavar="MASK.mp4",
                   help="VACE folders: binary mask video, one frame per control video frame "
                        "(white = generate, black = keep)")
    p.add_argument("--reference-image", "--reference", action="append", default=[],
                   metavar="REF.png", help="VACE folders: reference image (repeatable), "
                   "fitted on a white frame before the video")
    p.add_argument("--conditioning-scale", type=float, default=None, metavar="S",
                   help="VACE folders: scale of the control hints (1.0)")
    add_animate_arguments(p)
    p.add_argument("--height", type=int, default=None, help="pixels, multiple of 16 (480)")
    p.add_argument("--width", type=int, default=None, help="pixels, multiple of 16 (832)")
    p.add_argument("--frames", type=int, default=None, help="4k+1 frames (81)")
    p.add_argument("--steps", type=int, default=None, help="denoising steps (50)")
    p.add_argument("--guidance", type=float, default=None, help="CFG scale; <= 1 = off (5.0)")
    p.add_argument("--guidance-2", type=float, default=None,
                   help="low-noise expert's CFG scale (Wan 2.2 two-expert folders)")
    p.add_argument("--true-cfg", type=float, default=None, metavar="SCALE",
                   help="image models (FLUX.1): true CFG scale > 1 against --negative-prompt "
                        "(the pipeline's true_cfg_scale; --guidance stays the embedded "
                        "guidance); off by default")
    p.add_argument("--lora", action="append", default=[], metavar="FILE[:STRENGTH]",
                   help="LoRA for the transformer (repeatable; any Wan LoRA format; merged "
                        "unless --lora-mode unmerged)")
    p.add_argument("--lora-2", action="append", default=[], metavar="FILE[:STRENGTH]",
                   help="LoRA for the low-noise expert transformer_2 (Wan 2.2; repeatable)")
    p.add_argument("--lora-mode", choices=("merged", "unmerged"), default="merged",
                   help="merged: folded into the weights as they load (no run-time cost); "
                        "unmerged: low-rank updates at run time (Linear layers only)")
    p.add_argument("--lora-strict", action=argparse.BooleanOptionalAction, default=True,
                   help="LoRA keys that match no layer are an error (--no-lora-strict: "
                        "skipped with a warning listing them)")
    p.add_argument("--seed", type=int, default=0,
                   help="noise seed, 0 <= SEED < 2**32 (jax's PRNGKey keeps 32 bits)")
    p.add_argument("--output", default="out.mp4", help="mp4 path (H.264)")
    p.add_argument("--frames-dir", default=None, help="also write PNG frames here")
    p.add_argument("--fps", type=int, default=None,
                   help="frames per second of the mp4 (default: the folder's, else 16)")
    p.add_argument("--no-progress", action="store_true",
                   help="hide the progress bar and the loading / compiling status line")
    p.add_argument("overrides", nargs="*", default=[], metavar="key=value",
                   help="config overrides: model.dtype=bfloat16 attention.backend=ulysses "
                        "mesh.context=8 sample.cfg_mode=sequential sample.scheduler=euler "
                        "sample.cache=teacache sample.cache_threshold=0.2 sample.cfg_cache=true "
                        "...")


def parse_request(args):
    """Parse and validate the request and config; returns ``(load_kwargs, call_kwargs)``.

    Nothing here reads a model.
    """
    import jax

    from ditax.cli.sample_request import sample_request
    from ditax.config import validate
    from ditax.io.outputs import check_output_file, check_output_folder

    req = sample_request(args.model, args.overrides)
    if req.pipelines.makes == "image":
        return image_request(args, req)
    if getattr(args, "true_cfg", None) is not None:
        raise RequestError(f"--true-cfg is an image model's flag (FLUX.1 true CFG); "
                           f"{args.model} is a video model — use --guidance (its CFG scale)")
    cfg, given, chosen, defaults = req.cfg, req.given, req.chosen, req.defaults
    s = cfg.sample
    args.model = req.model
    if args.fps is None:
        args.fps = defaults["fps"]
    call = dict(prompt=args.prompt,
                negative_prompt=(args.negative_prompt if args.negative_prompt is not None
                                 else defaults["negative_prompt"]),
                height=args.height if args.height is not None else defaults["height"],
                width=args.width if args.width is not None else defaults["width"],
                num_frames=args.frames if args.frames is not None else defaults["num_frames"],
                num_inference_steps=(args.steps if args.steps is not None
                                     else defaults["num_inference_steps"]),
                guidance_scale=(args.guidance if args.guidance is not None
                                else defaults["guidance_scale"]),
                guidance_scale_2=(args.guidance_2 if args.guidance_2 is not None
                                  else defaults["guidance_scale_2"]),
                seed=args.seed, sigmas=s.sigmas, cache=s.cache, cache_threshold=s.cache_threshold,
                cfg_cache=s.cfg_cache, cache_coefficients=s.cache_coefficients)
    if s.cache_coefficients is not None:
        from ditax.pipelines.cache.numbers import read_numbers

        read_numbers(s.cache_coefficients)      # a readable numbers file, before any weights
    with request_errors():
        req.pipelines.check_request(call["prompt"], call["height"], call["width"],
                                    call["num_frames"], call["num_inference_steps"],
                                    call["guidance_scale"], call["guidance_scale_2"],
                                    call["negative_prompt"], seed=call["seed"])
    if s.sigmas is not None and len(s.sigmas) != call["num_inference_steps"]:
        origin = f" (sample.preset={s.preset})" if s.preset else ""
        raise RequestError(f"sample.sigmas has {len(s.sigmas)} values{origin} but --steps "
                           f"{call['num_inference_steps']}; drop --steps or pass "
                           f"sample.sigmas=none")
    check_output_file(args.output, "--output")
    if pathlib.Path(args.output).suffix.lower() != ".mp4":
        raise RequestError(f"--output {args.output!r} must end in .mp4 (H.264); use --frames-dir "
                           f"for PNG frames")
    if args.frames_dir is not None:
        check_output_folder(args.frames_dir, "--frames-dir")
        if pathlib.Path(args.frames_dir).absolute() == pathlib.Path(args.output).absolute():
            raise RequestError(f"--frames-dir {args.frames_dir} is the --output path; give the "
                               f"PNG frames their own folder")
    if args.fps < 1:
        raise RequestError(f"--fps={args.fps} must be >= 1 (Wan: 16)")
    loras = read_loras(args.lora, args.lora_strict)
    loras_2 = read_loras(args.lora_2, args.lora_strict)
    call.update(read_images(args.image, args.last_image))
    call.update(read_control(args))
    call.update(read_source_video(args, call, req.pipelines.check_request))
    call = read_animate(args, call, s)
    use_mesh = "mesh" in given
    validate(cfg, jax.device_count() if use_mesh else None)
    dtype = cfg.model.dtype
    if "param_dtype" in given.get("model", {}) and cfg.model.param_dtype != dtype:
        raise ConfigError(f"model.param_dtype={cfg.model.param_dtype} differs from model.dtype="
                          f"{dtype}; the pipeline loads weights in one dtype — set model.dtype")
    model_over = {k: getattr(cfg.model, k) for k in given.get("model", {})
                  if k not in ("dtype", "param_dtype")}
    load = dict(path=args.model, dtype=dtype, attention=cfg.attention,
                cfg_mode=s.cfg_mode, flow_shift=s.flow_shift, vae_tiling=s.vae_tiling,
                max_sequence_length=defaults["max_sequence_length"],
                scheduler=s.scheduler if "scheduler" in chosen else None,
                mesh_config=cfg.mesh if use_mesh else None, loras=loras, loras_2=loras_2,
                lora_mode=args.lora_mode, lora_strict=args.lora_strict,
                compile_cache=cfg.compile_cache, **model_over)
    if "strength" in call:
        load["video_to_video"] = True
    return load, call


# flags an image model (PipelineFamily.makes == "image") does not take, by their argparse name
VIDEO_FLAGS = {"frames": "--frames", "image": "--image", "last_image": "--last-image",
               "video": "--video", "strength": "--strength",
               "guidance_2": "--guidance-2", "frames_dir": "--frames-dir", "fps": "--fps",
               "lora_2": "--lora-2", "mask": "--mask", "reference_image": "--reference-image",
               "conditioning_scale": "--conditioning-scale",
               **{k: "--" + k.replace("_", "-") for k in ANIMATE_FLAGS}}


def image_request(args, req):
    """:func:`parse_request` of an image model's folder: the video-only flags refused in one
    line, ``--output`` a ``.png``; ``(load_kwargs, call_kwargs)``, ``load["makes"] = "image"``."""
    import jax

    from ditax.config import validate
    from ditax.io.outputs import check_output_file

    name = req.pipelines.name
    for key, flag in VIDEO_FLAGS.items():
        if getattr(args, key, None) not in (None, []):   # ditax serve has no --video
            raise RequestError(f"{flag} is a video flag; {args.model} is an image model "
                               f"({name}) — drop it")
    true_cfg = getattr(args, "true_cfg", None)     # ditax serve's requests have none
    if (args.negative_prompt is None) != (true_cfg is None):
        raise RequestError("--negative-prompt and --true-cfg go together (true CFG against "
                           "the negative prompt), e.g. --negative-prompt 'blurry' --true-cfg 4;"
                           " give both or neither")
    cfg, given, d = req.cfg, req.given, req.defaults
    if req.cfg.sample.cache or req.cfg.sample.cfg_cache or req.cfg.sample.sigmas is not None:
        raise RequestError(f"sample.cache / sample.cfg_cache / sample.sigmas are not read by "
                           f"{name} folders yet; drop them")
    args.model = req.model
    call = dict(prompt=args.prompt, seed=args.seed,
                height=args.height if args.height is not None else d["height"],
                width=args.width if args.width is not None else d["width"],
                num_inference_steps=args.steps if args.steps is not None
                else d["num_inference_steps"],
                guidance_scale=args.guidance if args.guidance is not None
                else d["guidance_scale"],
                max_sequence_length=d["max_sequence_length"])
    if true_cfg is not None:
        call.update(negative_prompt=args.negative_prompt, true_cfg_scale=true_cfg)
    with request_errors():
        req.pipelines.check_request(call["prompt"], call["height"], call["width"], 1,
                                    call["num_inference_steps"], call["guidance_scale"],
                                    seed=call["seed"], **({} if true_cfg is None else dict(
                                        negative_prompt=args.negative_prompt,
                                        true_cfg_scale=true_cfg)))
    check_output_file(args.output, "--output", example="out.png")
    if pathlib.Path(args.output).suffix.lower() != ".png":
        raise RequestError(f"--output {args.output!r} must end in .png ({args.model} is an "
                           f"image model)")
    use_mesh = "mesh" in given
    validate(cfg, jax.device_count() if use_mesh else None)
    model_over = {k: getattr(cfg.model, k) for k in given.get("model", {})
                  if k not in ("dtype", "param_dtype")}
    loras = read_loras(args.lora, args.lora_strict, family=name)
    load = dict(path=args.model, dtype=cfg.model.dtype, attention=cfg.attention,
                cfg_mode=cfg.sample.cfg_mode, vae_tiling=cfg.sample.vae_tiling,
                mesh_config=cfg.mesh if use_mesh else None, compile_cache=cfg.compile_cache,
                loras=loras, lora_mode=args.lora_mode, lora_strict=args.lora_strict,
                makes="image", **model_over)
    return load, call


def read_images(image: str | None, last_image: str | None) -> dict:
    """``--image`` / ``--last-image`` files read into ``image=`` / ``last_image=`` (an
    unreadable file is a :class:`RequestError`: exit 2)."""
    from ditax.io.images import read_image

    if last_image is not None and image is None:
        raise RequestError("--last-image needs --image (the first frame) too")
    out = {}
    if image is not None:
        out["image"] = read_image(image, "--image")
    if last_image is not None:
        out["last_image"] = read_image(last_image, "--last-image")
    return out


def read_source_video(args, call: dict, check) -> dict:
    """``--video`` read into ``video=`` (float ``[F, H, W, 3]`` in [0, 1]; ``--frames N``: its
    first N) with ``strength=``; the request's size and frame count become the video's where
    ``--height`` / ``--width`` / ``--frames`` are not given, and are checked again
    (``check``: the family's request check)."""
    import numpy as np

    from ditax.io.video import read_video

    video, strength = getattr(args, "video", None), getattr(args, "strength", None)
    if video is None:
        if strength is not None:
            raise RequestError("--strength is video-to-video; give the source with --video IN.mp4")
        return {}
    frames = read_video(video)
    if args.frames is not None:
        if len(frames) < args.frames:
            raise RequestError(f"--video {video} has {len(frames)} frames, fewer than --frames "
                               f"{args.frames}; lower --frames (4k+1)")
        frames = frames[:args.frames]
    call.update(num_frames=len(frames), height=args.height or frames.shape[1],
                width=args.width or frames.shape[2])
    try:
        with request_errors():
            check(call["prompt"], call["height"], call["width"], call["num_frames"],
                  call["num_inference_steps"], call["guidance_scale"])
    except RequestError as e:
        raise RequestError(f"--video {video} ({frames.shape[2]}x{frames.shape[1]}, "
                           f"{len(frames)} frames): {e}") from None
    out = {"video": frames.astype(np.float32) / np.float32(255.0)}
    if strength is not None:
        out["strength"] = strength
    return out


def read_control(args) -> dict:
    """VACE's ``--mask`` (frames in [0, 1]) / ``--reference-image`` / ``--conditioning-scale``
    as call arguments; the folder's preflight checks them against it and the request."""
    from ditax.io.images import read_image
    from ditax.io.video import read_video

    out, refs = {}, getattr(args, "reference_image", None)
    if refs:
        out["reference_images"] = [read_image(r, "--reference-image") for r in refs]
    if getattr(args, "mask", None) is not None:
        out["mask"] = read_video(args.mask) / 255.0
    if getattr(args, "conditioning_scale", None) is not None:
        out["conditioning_scale"] = args.conditioning_scale
    return out


def read_loras(specs: list[str], strict: bool = True, family: str | None = None) -> list:
    """``--lora FILE[:STRENGTH]`` values → ``[(Lora, strength)]``, each file read and its
    format checked here (a bad file is a :class:`~ditax.errors.WeightError`: exit 2; with
    ``strict=False`` unknown keys are skipped with a warning). Files are named by ``family``'s
    LoRA names (:meth:`~ditax.models.base.ModelFamily.lora_names`; None: the default
    family's)."""
    from ditax.lora import parse_lora_arg, resolve_loras
    from ditax.models.base import DEFAULT_FAMILY, family_class

    return resolve_loras([parse_lora_arg(s) for s in specs], strict,
                         names=family_class(family or DEFAULT_FAMILY).lora_names())


def run(args) -> int:
    load, call = parse_request(args)
    import ditax
    from ditax.cli.run import run_context
    from ditax.io.images import write_png
    from ditax.io.video import write_frames, write_mp4
    from ditax.pipelines.family import preflight

    mesh_cfg = load.pop("mesh_config")
    cache = load.pop("compile_cache")
    image = load.pop("makes", "video") == "image"
    mesh = None if mesh_cfg is None else ditax.make_mesh(mesh_cfg)
    preflight(load["path"], load, call, mesh)   # the folder's family checks it, before weights
    if mesh is not None:
        print(f"mesh: {dict(mesh.shape)}")
    show = not args.no_progress
    with run_context(load["attention"], mesh, compile_cache=cache, status=show) as folder:
        print(f"compile cache: {folder or 'off'}")
        pipe = ditax.load_pipeline(load.pop("path"), mesh=mesh, **load)
        with request_errors():  # e.g. a size this folder's VAE cannot take
            video = pipe(progress=show, **call)
    if image:
        t0 = time.perf_counter()
        path = write_png(args.output, video)
        print(f"{pipe.timings.line()} | write {time.perf_counter() - t0:.2f}s")
        print(f"wrote {path} ({video.shape[1]}x{video.shape[0]} image)")
        return 0
    t0 = time.perf_counter()
    path = write_mp4(args.output, video, fps=args.fps)
    if args.frames_dir:
        write_frames(args.frames_dir, video)
    t_write = time.perf_counter() - t0
    print(f"{pipe.timings.line()} | write {t_write:.2f}s")
    st = pipe.last_stats
    if st.get("cache") or st.get("cfg_cache"):
        skipped = sum(len(v) for v in st["skipped_steps"].values())
        reused = len(st.get("cfg_reused_steps", []))
        print(f"step cache {st['cache'] or 'off'} (threshold {st['cache_threshold']}), cfg_cache "
              f"{'on' if st['cfg_cache'] else 'off'}: {st['transformer_calls']} transformer calls "
              f"for {st['steps']} steps ({skipped} skipped, {reused} unconditional reused)")
    f, h, w, _ = video.shape
    print(f"wrote {path} ({f} frames, {w}x{h}, {args.fps} fps)"
          + (f" and {f} PNG frames in {args.frames_dir}" if args.frames_dir else ""))
    return 0
