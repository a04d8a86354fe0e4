"""``ditax preprocess VIDEOS OUT --model PIPELINE``: videos + captions → latent dataset.

Calls :func:`ditax.train.preprocess.preprocess` (the pipeline's VAE and UMT5 encode every
video and caption). The sizes, frames and text length not given are the folder's
``ditax_sample.json`` (:mod:`ditax.pipelines.sample_defaults`; the Wan demo: 64x64, 17 frames,
16 tokens; the small Flux: 64x64, 1 frame, 8 tokens), else the family's. The sizes, ``--dtype``, the output folder (new or empty, creatable), the
``--model`` path, every video's caption, files more than 4x smaller than the target on a side,
clips whose reference-image counts differ and non-binary mask videos are checked before any
model loads (exit 2, each problem with its file); a video that cannot be decoded is named
(exit 2). ``--resize crop`` (default) scales a file of another aspect ratio to cover the target
and keeps the center; ``--resize stretch`` squeezes it; ``meta.json`` and the last line say
which, and how many files it changed. The dataset is written into a temporary folder
beside OUT and renamed to OUT when complete, so a failure leaves no half-written dataset.
"""

from __future__ import annotations

from ditax.cli import model_arg, request_errors


def add_arguments(p) -> None:
    p.description = __doc__.split("\n\n")[0]
    p.add_argument("videos", help="folder of videos (+ name.txt captions or captions.jsonl)")
    p.add_argument("output", help="new dataset folder (must not exist, or be empty)")
    p.add_argument("--model", required=True, type=model_arg, help="diffusers pipeline "
                   "folder (vae/, text_encoder/, tokenizer/), hub id, 'demo' (the shipped Wan "
                   "demo model) or 'flux-demo' (the shipped small Flux)")
    p.add_argument("--height", type=int, default=None, help="pixels (default: the folder's "
                   "ditax_sample.json, else the family's: Wan 480, FLUX.1 1024)")
    p.add_argument("--width", type=int, default=None, help="pixels (default: the folder's "
                   "ditax_sample.json, else the family's: Wan 832, FLUX.1 1024)")
    p.add_argument("--frames", type=int, default=None, help="pixel frames (Wan: 4k+1; default: "
                   "the folder's ditax_sample.json, else 81; an image model such as FLUX.1: 1)")
    p.add_argument("--text-len", type=int, default=None, help="text tokens (default: the "
                   "folder's ditax_sample.json max_sequence_length, else 512)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--resize", default="crop", help="a file of another aspect ratio: 'crop' "
                   "(default: scale to cover --width x --height, keep the center) or 'stretch' "
                   "(scale each side on its own, distorting it)")
    p.add_argument("--batch", type=int, default=1, help="clips per encoder call (default 1; "
                   "small clips encode faster in groups, e.g. 8)")
    p.add_argument("--no-progress", action="store_true", help="no status line on stderr")


def run(args) -> int:
    from ditax.models import registry
    from ditax.train.preprocess import (
        check_model,
        check_output,
        check_request,
        find_samples,
        folder_family,
        preprocess,
        request_defaults,
    )

    with request_errors(FileNotFoundError):
        family = folder_family(args.model)
        registry.require(family, "preprocess", f"ditax preprocess --model {args.model}",
                         "preprocess with a folder of a family that has encoders (e.g. "
                         "--model demo)")
        given = dict(height=args.height, width=args.width, frames=args.frames,
                     text_len=args.text_len)
        d = request_defaults(args.model, family) if None in given.values() else {}
        size = {k: d[k] if v is None else v for k, v in given.items()}
        check_request(**size, dtype=args.dtype, batch=args.batch, family=family,
                      model=args.model, resize=args.resize)
        check_output(args.output)
        check_model(args.model)
        find_samples(args.videos, height=size["height"], width=size["width"],
                     frames=size["frames"])
    from ditax.cli.status import status_line
    from ditax.phases import phase

    with status_line(not args.no_progress), phase("preprocess"):
        out = preprocess(args.videos, args.output, args.model, **size, dtype=args.dtype,
                         batch=args.batch, family=family, resize=args.resize)
    print(f"ditax preprocess: wrote {out}; train with data.source={out}")
    return 0
