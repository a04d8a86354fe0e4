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
beside OUT and renamed to OUT when complete, so a failure leaves no half-written dataset; a
write that fails (the disk full, a quota, no permission) is one line naming OUT and the cause
(exit 1). OUT may be ``file:///ABSOLUTE/PATH`` (that local folder) or a bucket URL (written
locally, then uploaded, :mod:`ditax.io.remote`); ``memory://`` is refused (its store dies
with the command).

``--buckets 832x480x81,480x832x81`` or ``--bucket-area PIXELS --frames 81,49,17``: one dataset
of several shapes (``meta.json`` version 2): each clip goes to the bucket nearest its aspect
ratio, with the longest frame count it has, scaled to cover and center-cropped
(:mod:`ditax.train.buckets`). A clip that fits no bucket (too short, a still without a frame-1
bucket) is skipped with a line before any encoding and listed in ``meta.json`` ``skipped``;
exit 2 only when no clip fits any bucket. ``--num-processes N --process-id K``: process K
encodes its share of the clips into ``OUT/part-0000K-of-0000N/``; the one that completes the
last part writes ``meta.json`` (:mod:`ditax.train.preprocess_parts`).
"""

from __future__ import annotations

from ditax.cli import CommandFailed, model_arg, request_errors
from ditax.io.remote.urls import resolve


def add_arguments(p) -> None:
    p.description = __doc__.split("\n\n")[0]
    p.add_argument("videos", help="folder of videos (+ name.txt captions or captions.jsonl)")
    p.add_argument("output", help="new dataset folder (must not exist, or be empty; with "
                   "--num-processes it may hold the other processes' parts)")
    p.add_argument("--model", required=True, type=model_arg, help="diffusers pipeline "
                   "folder (vae/, text_encoder/, tokenizer/), hub id, 'demo' (the shipped Wan "
                   "demo model) or 'flux-demo' (the shipped small Flux)")
    p.add_argument("--height", type=int, default=None, help="pixels (default: the folder's "
                   "ditax_sample.json, else the family's: Wan 480, FLUX.1 1024)")
    p.add_argument("--width", type=int, default=None, help="pixels (default: the folder's "
                   "ditax_sample.json, else the family's: Wan 832, FLUX.1 1024)")
    p.add_argument("--frames", default=None, help="pixel frames (Wan: 4k+1; default: "
                   "the folder's ditax_sample.json, else 81; an image model such as FLUX.1: 1); "
                   "with --bucket-area a list, e.g. 81,49,17 (1: buckets for still images)")
    p.add_argument("--text-len", type=int, default=None, help="text tokens (default: the "
                   "folder's ditax_sample.json max_sequence_length, else 512)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--resize", default="crop", help="a file of another aspect ratio: 'crop' "
                   "(default: scale to cover --width x --height, keep the center) or 'stretch' "
                   "(scale each side on its own, distorting it); buckets always crop")
    p.add_argument("--buckets", default=None, metavar="WxHxF,...", help="a dataset of several "
                   "shapes: WIDTHxHEIGHTxFRAMES buckets, e.g. 832x480x81,480x832x81,624x624x81 "
                   "(sides on the family's grid: multiples of 16 for Wan and FLUX.1); each "
                   "clip goes to the bucket nearest its aspect ratio with the longest frame "
                   "count it has (instead of --height / --width / --frames)")
    p.add_argument("--bucket-area", type=int, default=None, metavar="PIXELS", help="derive "
                   "the buckets: every size WxH <= PIXELS (sides multiples of the family's "
                   "step) from aspect 1:2 to 2:1, with each of --frames (e.g. --bucket-area "
                   "399360 --frames 81,49,17 for Wan at 480p)")
    p.add_argument("--batch", type=int, default=1, help="clips per encoder call (default 1; "
                   "small clips encode faster in groups, e.g. 8; buckets: clips of one bucket)")
    p.add_argument("--num-processes", type=int, default=None, metavar="N", help="split the "
                   "clips over N processes (machines or jobs), each run with --process-id")
    p.add_argument("--process-id", type=int, default=None, metavar="K", help="this process's "
                   "share (0 .. N-1): writes OUT/part-0000K-of-0000N; the process completing "
                   "the last part writes meta.json")
    p.add_argument("--no-progress", action="store_true", help="no status line on stderr")


def run(args) -> int:
    from ditax.models import registry
    from ditax.train.preprocess import folder_family, prepare
    from ditax.train.preprocess import run as encode

    remote = None
    # the one rule for paths and URLs (ditax.io.remote.urls.resolve): file:// is the local
    # path; memory:// (gone when this command ends) is refused for the dataset
    args.videos = str(resolve(args.videos, "VIDEOS", remote=False, output=False,
                              expected="a folder of videos"))
    out = resolve(args.output, "output", expected="a new folder for the dataset")
    if isinstance(out, str):        # a URL: written to a staging folder, then uploaded
        from ditax.io.remote.dataset_output import DatasetUpload
        from ditax.train.preprocess_parts import merge_parts

        remote = DatasetUpload(out, args.num_processes, args.process_id, merge=merge_parts)
        args.output = str(remote.local)
    else:
        args.output = str(out)
    with request_errors(FileNotFoundError):
        family = folder_family(args.model)
        registry.require(family, "preprocess", f"ditax preprocess --model {args.model}",
                         "preprocess with a folder of a family that has encoders (e.g. "
                         "--model demo)")
        job = prepare(args.videos, args.output, args.model, height=args.height,
                      width=args.width, frames=args.frames, text_len=args.text_len,
                      dtype=args.dtype, family=family, batch=args.batch, resize=args.resize,
                      buckets=args.buckets, bucket_area=args.bucket_area,
                      num_processes=args.num_processes, process_id=args.process_id)
    from ditax.front.status import status_line
    from ditax.phases import phase

    from ditax.io.outputs import WriteFailed

    try:
        with status_line(not args.no_progress), phase("preprocess"):
            out = encode(job)
    except WriteFailed as e:        # a full disk, a quota, no permission: exit 1, one line
        raise CommandFailed(str(e)) from e
    if remote is not None:          # upload what this process wrote (ditax.io.remote)
        print(f"ditax preprocess: {remote.finish()}")
        return 0
    if job.part[1] > 1 and not (out / "meta.json").is_file():
        print(f"ditax preprocess: wrote {out}/part-{job.part[0]:05d}-of-{job.part[1]:05d}; "
              f"the dataset is complete when every part is")
    else:
        print(f"ditax preprocess: wrote {out}; train with data.source={out}")
    return 0
