"""``ditax export RUN_DIR --out FOLDER``: a training run's checkpoint as a diffusers pipeline
folder.

    ditax export runs/a --out Wan-1.3B-tuned                 # the newest checkpoint
    ditax export runs/a --out Wan-1.3B-tuned-500 --step 500 --dtype bfloat16
    ditax export runs/b --out tuned --base Wan-AI/Wan2.1-T2V-1.3B-Diffusers --link

The transformer comes from the run's checkpoint (a full fine-tune; a LoRA run's adapters are
already its LoRA files, named when one is given), the VAE, text encoders, tokenizers, scheduler
and model_index.json from the run's init_from or --base (copied; --link: linked). The folder
loads with ditax.load_pipeline and diffusers' from_pretrained (:mod:`ditax.train.export`).
Every input is checked before a weight is read: exit 2 with one line naming it and the fix.
RUN_DIR and --out may be file:///ABSOLUTE/PATH (that local folder) or a bucket URL; a
memory:// --out is refused (its store dies with the command). The folder is written hidden
beside --out and renamed when complete: a write that fails (the disk full, a quota, no
permission) is one line naming --out and the cause, exit 1, and nothing is left at --out.
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = __doc__.split("\n\n")[0]
    p.add_argument("run", metavar="RUN_DIR", help="the output_dir of a ditax train run")
    p.add_argument("--out", required=True, metavar="FOLDER",
                   help="the pipeline folder to write (new or empty)")
    p.add_argument("--step", type=int, default=None,
                   help="the checkpoint step to export (default: the newest)")
    p.add_argument("--base", default=None, metavar="FOLDER",
                   help="the pipeline folder (or hub id) the other components come from "
                        "(default: the run's init_from)")
    p.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "float16"),
                   help="cast the transformer's tensors (default: as trained)")
    p.add_argument("--link", action="store_true",
                   help="link the base's components instead of copying them (the folder then "
                        "needs the base to stay where it is)")


def run(args) -> int:
    from ditax.cli import CommandFailed
    from ditax.io.outputs import WriteFailed
    from ditax.train.export import export_run, plan_export

    plan = plan_export(args.run, args.out, step=args.step, base=args.base, dtype=args.dtype,
                       link=args.link)
    try:
        export_run(plan)
    except WriteFailed as e:        # a full disk, a quota, no permission: exit 1, one line
        raise CommandFailed(str(e)) from e
    return 0
