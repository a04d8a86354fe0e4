"""``ditax preprocess VIDEOS OUT --model PIPELINE``: videos + captions → latent dataset.

Calls :func:`ditax.train.preprocess.preprocess` (the pipeline's VAE and UMT5 encode every
video and caption). Every video needing a caption is checked before any model loads (exit 2).
"""

from __future__ import annotations

from ditax.cli import request_errors


def add_arguments(p) -> None:
    p.description = __doc__.split("\n\n")[0]
    p.add_argument("videos", help="folder of videos (+ name.txt captions or captions.jsonl)")
    p.add_argument("output", help="new dataset folder")
    p.add_argument("--model", required=True, help="diffusers Wan pipeline folder (vae/, "
                   "text_encoder/, tokenizer/)")
    p.add_argument("--height", type=int, default=480)
    p.add_argument("--width", type=int, default=832)
    p.add_argument("--frames", type=int, default=81, help="pixel frames, 4k+1")
    p.add_argument("--text-len", type=int, default=512)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--batch", type=int, default=1, help="clips per encoder call (default 1; "
                   "small clips encode faster in groups, e.g. 8)")


def run(args) -> int:
    from ditax.train.preprocess import find_samples, preprocess

    with request_errors(FileNotFoundError):
        find_samples(args.videos)
        if args.batch < 1:
            raise ValueError(f"--batch {args.batch}: clips per encoder call must be at least 1")
    out = preprocess(args.videos, args.output, args.model, height=args.height, width=args.width,
                     frames=args.frames, text_len=args.text_len, dtype=args.dtype,
                     batch=args.batch)
    print(f"ditax preprocess: wrote {out}; train with data.source={out}")
    return 0
