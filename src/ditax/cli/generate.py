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
:mod:`ditax.pipelines.wan.request_inputs`, declared and read by its family).

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
text, compile, denoise, decode, write). A Wan video's mp4 is encoded while the VAE decodes:
each decoded chunk's frames go to ffmpeg (on a thread) as the next chunk decodes, so ``write``
is only what is left after the decode, and the line says how many seconds of encoding ran
beside it (``write 0.20s (overlapped 1.40s)``), or why not (``(not overlapped: the decode
runs in spatial tiles ...)``: :mod:`ditax.cli.generate_output`). The mp4 and the PNGs are written beside their names and
renamed at the end: a failed run leaves no half-written file. Sizes, steps, guidance and fps
default to the folder's ``ditax_sample.json``, else its family's. The flags become one plain
mapping that the front door resolves (:func:`ditax.front.resolve`, as ``ditax serve`` does with
a request's JSON).
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

from ditax.errors import RequestError, request_errors

# generate's flags that are no request name (the command's own)
_COMMAND = {"model", "prompts", "batch", "no_progress", "overrides", "command", "debug"}


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


def add_input_flags(p: argparse.ArgumentParser) -> None:
    """One flag per input every known family declares (:attr:`~ditax.pipelines.family.
    PipelineFamily.inputs`), its help ending with the families that take it (a flag two
    families declare is added once, by the first, with both named)."""
    from ditax.pipelines.family import known_pipelines

    kinds = {"int": int, "float": float, "str": str}
    seen: dict[str, argparse.Action] = {}
    for family, pipelines in known_pipelines():
        for i in pipelines.inputs:
            if i.flag in seen:
                seen[i.flag].help = seen[i.flag].help.replace(" models]", f", {family} models]")
                continue
            extra = dict(action="append", default=[]) if i.repeat else dict(default=None)
            seen[i.flag] = p.add_argument(i.flag, *i.aliases, type=kinds[i.kind],
                                          metavar=i.metavar, choices=i.choices,
                                          help=f"{i.help} [{family} models]", **extra)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="pipeline folder (model_index.json), hub id, "
                   "'demo' (the shipped Wan demo), 'demo-causal' (its causal student) or "
                   "'flux-demo' (the shipped small Flux); a "
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
    add_input_flags(p)
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


def given_of(args) -> dict:
    """The flags of ``args`` as the front door's plain mapping (:func:`ditax.front.resolve`):
    request fields by their names (``--steps`` → ``num_inference_steps``), inputs and options
    by theirs."""
    from ditax.pipelines.request import all_fields

    by_dest = {f.dest: name for name, (f, _) in all_fields().items() if f.cli}
    return {by_dest.get(k, k): v for k, v in vars(args).items() if k not in _COMMAND}


def parse_request(args, given: dict | None = None):
    """The checked :class:`~ditax.front.Request` of ``args`` (``given``: its mapping, default
    :func:`given_of`); nothing here reads a model."""
    from ditax.front import resolve

    return resolve(args.model, args.overrides, given_of(args) if given is None else given,
                   "cli")


def run(args) -> int:
    from ditax.cli.generate_many import read_prompts, run_many
    from ditax.cli.generate_output import write_output
    from ditax.front import open as open_pipeline

    if args.prompts is not None and args.prompt is not None:
        raise RequestError("--prompt and --prompts: give one prompt with --prompt, or a file of "
                           "them with --prompts FILE, not both")
    if args.prompts is None and args.prompt is None:
        raise RequestError("no prompt: give --prompt 'a cat walks on the grass' (or --prompts "
                           "FILE, one prompt a line)")
    if args.batch < 1:
        raise RequestError(f"--batch {args.batch} must be >= 1 (1: the prompts one by one)")
    if args.prompts is not None:
        return run_many(args, given_of(args), read_prompts(args.prompts))
    req = parse_request(args)
    with contextlib.ExitStack() as stack:
        stream = None
        if req.makes == "video":    # encoded as the decode hands its frames over
            from ditax.io.video_stream import Mp4Stream

            stream = stack.enter_context(Mp4Stream(req.output.path, req.output.fps or 16))
        with open_pipeline(req.load, req.call, progress=not args.no_progress) as pipe:
            call = req.kwargs()
            if stream is not None and getattr(pipe, "hands_frames", False):
                call["frames_to"] = stream
            elif stream is not None:
                stream.whole(f"{type(pipe).__name__} decodes the video whole")
            with request_errors():  # e.g. a size this folder's VAE cannot take
                out = pipe(progress=not args.no_progress, **call)
        write_output(req.output, out, pipe, req.makes, stream)
    return 0
