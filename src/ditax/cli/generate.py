"""``ditax generate``: prompt → the output of a model folder (or hub id): an mp4 for a video
family (Wan), a PNG for an image family (FLUX.1 ``FluxPipeline``: ``--output x.png``; true CFG
with ``--negative-prompt TEXT --true-cfg SCALE``, the pipeline's ``negative_prompt=`` /
``true_cfg_scale=``). The request's flags are the fields of :mod:`ditax.pipelines.request`:
the common ones and each family's own (``--frames``, ``--guidance-2`` for Wan; ``--true-cfg``
for FLUX.1; a registered family's own too); a flag the folder's family does not take is refused
in one line naming the family. ``--prompts FILE`` runs many prompts (one a line, or JSON lines of
requests) on one loaded pipeline, one output each.

    ditax generate --model Wan-AI/Wan2.1-T2V-1.3B-Diffusers --prompt "a cat on a skateboard" \\
        --height 480 --width 832 --frames 81 --steps 50 --guidance 5 --output cat.mp4 \\
        model.dtype=bfloat16 attention.backend=ulysses mesh.context=8 sample.cfg_mode=batched
    ditax generate --model Wan-AI/Wan2.2-TI2V-5B-Diffusers --image first.png --prompt "..." \\
        --height 704 --width 1280 --frames 121

Image-to-video folders (``WanImageToVideoPipeline``; ``expand_timesteps`` TI2V) take
``--image FIRST`` (required for I2V, optional for TI2V) and ``--last-image LAST``
(first-last-frame models and Wan 2.2 I2V); a text-to-video folder refuses them. Wan 2.2
Animate folders take ``--image REF --pose-video --face-video`` (Wan's input flags:
:mod:`ditax.pipelines.wan.cli_inputs`, added and read through its family).

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
import contextlib
import pathlib
import time

from ditax.cli import request_errors
from ditax.errors import ConfigError, RequestError

# what each output kind (PipelineFamily.makes) is written as
SUFFIX = {"video": ".mp4", "image": ".png"}


def add_request_flags(p: argparse.ArgumentParser) -> None:
    """One flag per request field of every known family (:func:`ditax.pipelines.request.
    all_fields`); a family's own field says whose it is. All default to None (not given)."""
    from ditax.pipelines.request import all_fields, flag_help

    kinds = {"int": int, "float": float, "str": str}
    for name, (f, families) in all_fields().items():
        if not f.cli:
            continue       # a field several families declare: each one's help (their rules)
        p.add_argument(f.cli, type=kinds[f.kind], default=None, metavar=f.metavar,
                       help=flag_help(name))


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ditax.pipelines.family import known_pipelines

    p.add_argument("--model", required=True, help="pipeline folder (model_index.json), hub id, "
                   "'demo' (the shipped Wan demo) or 'flux-demo' (the shipped small Flux); a "
                   "folder's ditax_sample.json gives the defaults of the size, steps and "
                   "guidance flags")
    add_request_flags(p)
    p.add_argument("--prompts", default=None, metavar="FILE",
                   help="many requests on one loaded pipeline: one prompt a line, or JSON lines "
                        "of requests ({\"prompt\": ..., \"seed\": ...} with the server's field "
                        "names); the flags give the defaults; output i is --output with _i "
                        "before the suffix")
    p.add_argument("--batch", type=int, default=4, metavar="N",
                   help="--prompts: consecutive requests of one shape run as one batch of up "
                        "to N (4; 1 = one by one)")
    for _, pipelines in known_pipelines():     # each family's own input flags (files)
        pipelines.add_cli_inputs(p)
    p.add_argument("--lora", action="append", default=[], metavar="FILE[:STRENGTH]",
                   help="LoRA for the transformer (repeatable; any of the family's LoRA "
                        "formats; merged unless --lora-mode unmerged)")
    p.add_argument("--lora-mode", choices=("merged", "unmerged"), default="merged",
                   help="merged: folded into the weights as they load (no run-time cost); "
                        "unmerged: low-rank updates at run time (Linear layers only)")
    p.add_argument("--lora-strict", action=argparse.BooleanOptionalAction, default=True,
                   help="LoRA keys that match no layer are an error (--no-lora-strict: "
                        "skipped with a warning listing them)")
    p.add_argument("--text-quantize", choices=("none", "int8", "fp8"), default="none",
                   help="the text encoder's block linears in 8 bits (UMT5, T5, Gemma-3, Qwen3, "
                        "Mistral-3)")
    p.add_argument("--text-offload", choices=("none", "host"), default=None,
                   help="host: the encoders' weights in host memory, on the device only while "
                        "a prompt is encoded (default: as model.offload)")
    p.add_argument("--output", default=None, help="output path: .mp4 (H.264) for a video "
                   "model (default out.mp4), .png for an image model (default out.png)")
    p.add_argument("--frames-dir", default=None, help="also write PNG frames here")
    p.add_argument("--no-audio", action="store_true",
                   help="a model that also makes sound (LTX-2): write the video without its "
                        "sound track (and skip decoding it)")
    p.add_argument("--fps", type=int, default=None,
                   help="frames per second of the mp4 (default: the folder's, else 16)")
    p.add_argument("--no-progress", action="store_true",
                   help="hide the progress bar and the loading / compiling status line")
    p.add_argument("overrides", nargs="*", default=[], metavar="key=value",
                   help="config overrides: model.dtype=bfloat16 attention.backend=ulysses "
                        "mesh.context=8 sample.cfg_mode=sequential sample.scheduler=euler "
                        "sample.cache=teacache sample.cache_threshold=0.2 sample.cfg_cache=true "
                        "...")


# generate's flags every family takes (besides the request fields)
_GENERIC = {"model", "prompts", "batch", "lora", "lora_mode", "lora_strict", "output", "no_progress",
            "overrides", "command", "debug", "surface", "lora_sample", "no_audio",
            "text_quantize", "text_offload"}


def refuse_other_flags(args, pipelines, model: str) -> None:
    """A given flag that neither the common request nor ``pipelines``' family takes (its
    :attr:`~ditax.pipelines.family.PipelineFamily.fields` and ``cli_inputs``) is refused in
    one line naming the family, before any work."""
    from ditax.pipelines.request import fields_of, not_taken

    takes = {f.dest for f in fields_of(pipelines) if f.cli} | set(pipelines.cli_inputs)
    for key, value in sorted(vars(args).items()):
        if key in _GENERIC or key in takes or value in (None, []):
            continue
        raise not_taken(pipelines, "--" + key.replace("_", "-"), "dest", key,
                        f"{model} is a {pipelines.name} folder, it makes {pipelines.makes}s")


def _pair_true_cfg(args, pipelines, surface: str) -> None:
    """A family with true CFG (a ``true_cfg_scale`` field) takes the negative prompt only
    with it: both or neither."""
    from ditax.pipelines.request import fields_of

    tcfg = next((f for f in fields_of(pipelines) if f.name == "true_cfg_scale"), None)
    if tcfg is None:
        return
    neg = "--negative-prompt" if surface == "cli" else "negative_prompt"
    shown = tcfg.shown(surface)
    if (args.negative_prompt is None) != (getattr(args, tcfg.dest, None) is None):
        eg = (f"{neg} 'blurry' {shown} 4" if surface == "cli"
              else f'"{neg}": "blurry", "{shown}": 4')
        raise RequestError(f"{neg} and {shown} go together (true CFG against the negative "
                           f"prompt), e.g. {eg}; give both or neither")


def parse_request(args):
    """Parse and validate the request and config; returns ``(load_kwargs, call_kwargs)``
    (``load["makes"]``: the family's output kind). ``args.surface`` (default ``"cli"``; the
    server's ``"api"``) says how messages name the fields. Nothing here reads a model."""
    import jax

    from ditax.cli.sample_request import check_sizes, sample_request
    from ditax.config import validate
    from ditax.io.outputs import check_output_file, check_output_folder
    from ditax.models.registry import require, spec
    from ditax.pipelines.request import build_request, fields_of

    surface = getattr(args, "surface", "cli")
    req = sample_request(args.model, args.overrides)
    pipes = req.pipelines
    refuse_other_flags(args, pipes, args.model)
    cfg, given, chosen, defaults = req.cfg, req.given, req.chosen, req.defaults
    s = cfg.sample
    args.model = req.model
    makes = pipes.makes
    video = makes == "video"
    if s.cache or s.cfg_cache:      # the family declares step caching, or it is refused
        require(pipes.name, "step_cache", "sample.cache" if s.cache else "sample.cfg_cache",
                "drop it (the step cache is not wired into this family's pipelines)")
    _pair_true_cfg(args, pipes, surface)
    loras = read_loras(args.lora, args.lora_strict, family=pipes.name)
    lora_sample = read_lora_sample_args(args, pipes, loras)
    if lora_sample is not None:     # the LoRA's steps / guidance over the folder's, under chosen
        defaults = {**defaults, **{k: v for k, v in lora_sample.call_defaults().items()
                                   if k in defaults and k not in chosen}}
    request = build_request(
        pipes, {f.name: getattr(args, f.dest, None) for f in fields_of(pipes)
                if f.cli or f.name in ("height", "width")},
        {"seed": 0, **defaults}, surface, folder=args.model)
    call = request.call()
    if s.cache_coefficients is not None:
        from ditax.pipelines.cache.numbers import read_numbers

        read_numbers(s.cache_coefficients)      # a readable numbers file, before any weights
    with request_errors():
        check_sizes(req, call)      # the folder's one size rule, before the family's checks
        pipes.check_request(**call)
    if s.sigmas is not None and len(s.sigmas) != call["num_inference_steps"]:
        origin = f" (sample.preset={s.preset})" if s.preset else ""
        raise RequestError(f"sample.sigmas has {len(s.sigmas)} values{origin} but --steps "
                           f"{call['num_inference_steps']}; drop --steps or pass "
                           f"sample.sigmas=none")
    suffix = SUFFIX.get(makes, ".mp4")
    if args.output is None:
        args.output = "out" + suffix
    args.output = str(check_output_file(args.output, "--output", example="out" + suffix))
    if pathlib.Path(args.output).suffix.lower() != suffix:
        fix = "; use --frames-dir for PNG frames" if video else ""
        raise RequestError(f"--output {args.output!r} must end in {suffix} ({args.model} makes "
                           f"{makes}s){fix}")
    if spec(pipes.name).has("step_cache"):    # the generic loop's step cache
        call.update(cache=s.cache, cache_threshold=s.cache_threshold, cfg_cache=s.cfg_cache,
                    cache_coefficients=s.cache_coefficients)
    if video:                                  # the written video's own flags
        if getattr(args, "fps", None) is None:     # a model made for a frame rate: at it
            rate = call.get("frame_rate")
            args.fps = (int(rate) if float(rate).is_integer() else rate) if rate else \
                defaults.get("fps") or 16
        if getattr(args, "frames_dir", None) is not None:
            args.frames_dir = str(check_output_folder(args.frames_dir, "--frames-dir"))
            if pathlib.Path(args.frames_dir).absolute() == pathlib.Path(args.output).absolute():
                raise RequestError(f"--frames-dir {args.frames_dir} is the --output path; give "
                                   f"the PNG frames their own folder")
        if args.fps < 1:
            raise RequestError(f"--fps={args.fps} must be >= 1 (Wan: 16)")
    if "audio" in pipes.outputs:               # a family that makes a sound track
        call["audio"] = not getattr(args, "no_audio", False)
    elif getattr(args, "no_audio", False):
        raise RequestError(f"--no-audio: {args.model} is a {pipes.name} folder, which makes no "
                           f"sound track; drop --no-audio")
    call = pipes.read_cli_inputs(args, call, s)      # the family's files (images, videos)
    own_call, own_load = pipes.sample_options(args, s, chosen, defaults, call)
    if lora_sample is not None:
        lora_options(lora_sample, own_call, own_load, chosen, call["num_inference_steps"])
    if s.sigmas is not None and "sigmas" not in own_call:
        raise RequestError(f"sample.sigmas is not read by {pipes.name} folders (they set "
                           f"their own schedule); drop it")
    call.update(own_call)
    use_mesh = "mesh" in given
    validate(cfg, jax.device_count() if use_mesh else None)
    dtype = cfg.model.dtype
    if "param_dtype" in given.get("model", {}) and cfg.model.param_dtype != dtype:
        raise ConfigError(f"model.param_dtype={cfg.model.param_dtype} differs from model.dtype="
                          f"{dtype}; the pipeline loads weights in one dtype — set model.dtype")
    model_over = {k: getattr(cfg.model, k) for k in given.get("model", {})
                  if k not in ("dtype", "param_dtype")}
    load = dict(path=args.model, dtype=dtype, attention=cfg.attention, cfg_mode=s.cfg_mode,
                vae_tiling=s.vae_tiling, mesh_config=cfg.mesh if use_mesh else None,
                loras=loras, lora_mode=args.lora_mode, lora_strict=args.lora_strict,
                compile_cache=cfg.compile_cache, makes=makes, **model_over)
    if s.vae_parallel:
        load["vae_parallel"] = True
    if getattr(args, "text_quantize", "none") != "none":
        load["text_quantize"] = args.text_quantize
    if getattr(args, "text_offload", None) is not None:
        load["text_offload"] = args.text_offload
    load.update(own_load)
    return load, call


def read_lora_sample_args(args, pipelines, loras: list):
    """The sampling settings the ``--lora`` files (``loras``: read by :func:`read_loras`) and
    the ``--lora-2`` files (their headers) carry
    (:func:`ditax.pipelines.lora_sample.read_lora_sample`), read once: kept in
    ``args.lora_sample`` (``--prompts`` hands them to the requests after the first) and
    announced in one line when read."""
    from ditax.lora import parse_lora_arg
    from ditax.pipelines.lora_sample import read_lora_sample

    if getattr(args, "lora_sample", None) is not None:
        return args.lora_sample
    args.lora_sample = read_lora_sample(pipelines, loras, [
        parse_lora_arg(a) for a in getattr(args, "lora_2", None) or []])
    if args.lora_sample is not None:
        print(args.lora_sample.line("flags override"))
    return args.lora_sample


def lora_options(lora_sample, call: dict, load: dict, chosen: set, steps: int) -> None:
    """The family's own call and load arguments (``call``, ``load``: of
    :meth:`~ditax.pipelines.family.PipelineFamily.sample_options`) with the LoRA's sampler and
    shift where the user chose none (``chosen``: the ``sample`` keys set) and its sigmas where
    the call takes sigmas, the user gave none and the request has their ``steps`` on Euler."""
    from ditax.pipelines.lora_sample import LOAD_KEYS, default_sigmas

    values = lora_sample.values
    for key in LOAD_KEYS:
        if key in values and key not in chosen:
            load[key] = values[key]
    euler = load.get("scheduler") in (None, "euler")
    if "sigmas" in call and call["sigmas"] is None and "sigmas" not in chosen and euler:
        call["sigmas"] = default_sigmas(values, steps)


def read_loras(specs: list[str], strict: bool = True, family: str | None = None) -> list:
    """``--lora FILE[:STRENGTH]`` values → ``[(Lora, strength)]``, each file read and its
    format checked here (a bad file is a :class:`~ditax.errors.WeightError`: exit 2; with
    ``strict=False`` unknown keys are skipped with a warning). Files are named by ``family``'s
    LoRA names (its spec's ``lora_names``; None: the default family's); a family without
    the capability ``lora`` is refused in one line."""
    from ditax.lora import parse_lora_arg, resolve_loras
    from ditax.models import registry

    name = family or registry.DEFAULT_FAMILY
    if specs:       # a family that reads no LoRA files: one line, before any file is read
        registry.require(name, "lora", f"--lora {specs[0]}", "drop --lora")
    return resolve_loras([parse_lora_arg(s) for s in specs], strict,
                         names=registry.spec(name).lora_names_object())


def run(args) -> int:
    from ditax.cli.generate_many import read_prompts, run_many

    if args.prompts is not None and args.prompt is not None:
        raise RequestError("--prompt and --prompts: give one prompt with --prompt, or a file of "
                           "them with --prompts FILE, not both")
    if args.prompts is None and args.prompt is None:
        raise RequestError("no prompt: give --prompt 'a cat walks on the grass' (or --prompts "
                           "FILE, one prompt a line)")
    if args.batch < 1:
        raise RequestError(f"--batch {args.batch} must be >= 1 (1: the prompts one by one)")
    if args.prompts is not None:
        return run_many(args, read_prompts(args.prompts), parse_request=parse_request,
                        loaded=loaded, write_output=write_output, suffix=SUFFIX)
    load, call = parse_request(args)
    with loaded(load, call, args.no_progress) as pipe:
        with request_errors():  # e.g. a size this folder's VAE cannot take
            out = pipe(progress=not args.no_progress, **call)
    write_output(args, out, pipe, load["makes"])
    return 0


@contextlib.contextmanager
def loaded(load: dict, call: dict, no_progress: bool):
    """Check the folder against the request (its family's preflight, before any weights), then
    inside the run context (backends, compile cache, status line) the loaded pipeline."""
    import ditax
    from ditax.cli.run import run_context
    from ditax.pipelines.family import preflight

    load = dict(load)
    mesh_cfg, cache = load.pop("mesh_config"), load.pop("compile_cache")
    load.pop("makes", None)
    mesh = None if mesh_cfg is None else ditax.make_mesh(mesh_cfg)
    preflight(load["path"], load, call, mesh)
    if mesh is not None:
        print(f"mesh: {dict(mesh.shape)}")
    with run_context(load["attention"], mesh, compile_cache=cache,
                     status=not no_progress) as folder:
        print(f"compile cache: {folder or 'off'}")
        yield ditax.load_pipeline(load.pop("path"), mesh=mesh, **load)


def _timing(pipe) -> str:
    """The pipeline's timing line of its last call and a separator (empty: it keeps none)."""
    timings = getattr(pipe, "timings", None)
    return f"{timings.line()} | " if timings is not None else ""


def write_output(args, out, pipe, makes: str) -> None:
    """Write one result, renamed whole (:func:`ditax.io.results.write_result`; a failed write
    is one line naming the file and the cause, exit 1); print the timing and wrote lines."""
    from ditax.cli import CommandFailed
    from ditax.io.audio import AudioTrack
    from ditax.io.outputs import WriteFailed
    from ditax.io.results import write_result

    t0 = time.perf_counter()
    audio, extras = None, {}
    if isinstance(out, dict):          # a family with further outputs (PipelineFamily.outputs)
        extras = {k: v for k, v in out.items() if k != makes}
        audio = extras.pop("audio", None)     # a sound track goes into the mp4
        if audio is not None and not isinstance(audio, AudioTrack):
            extras["audio"] = audio
            audio = None
        out = out[makes]
    try:
        for path in write_result(args.output, out, fps=getattr(args, "fps", None) or 16,
                                 audio=audio, extras=extras,
                                 frames_dir=getattr(args, "frames_dir", None)):
            print(f"wrote {path}")
    except WriteFailed as e:
        raise CommandFailed(str(e)) from e
    path = args.output      # as it was checked (a file:// URL: its local path)
    if makes == "image":
        print(f"{_timing(pipe)}write {time.perf_counter() - t0:.2f}s")
        print(f"wrote {path} ({out.shape[1]}x{out.shape[0]} image)")
        return
    print(f"{_timing(pipe)}write {time.perf_counter() - t0:.2f}s")
    st = getattr(pipe, "last_stats", {})
    if st.get("cache") or st.get("cfg_cache"):
        skipped = sum(len(v) for v in st["skipped_steps"].values())
        reused = len(st.get("cfg_reused_steps", []))
        print(f"step cache {st['cache'] or 'off'} (threshold {st['cache_threshold']}), cfg_cache "
              f"{'on' if st['cfg_cache'] else 'off'}: {st['transformer_calls']} transformer calls "
              f"for {st['steps']} steps ({skipped} skipped, {reused} unconditional reused)")
    f, h, w, _ = out.shape
    sound = (f", {audio.channels}-channel {audio.sample_rate} Hz AAC sound track"
             if audio is not None else "")
    print(f"wrote {path} ({f} frames, {w}x{h}, {args.fps} fps{sound})"
          + (f" and {f} PNG frames in {args.frames_dir}" if args.frames_dir else ""))
