"""A pipeline folder with random weights, for machines that cannot download a real one: trying
``generate`` / ``serve`` / ``train`` / ``plan`` on a family without its weights (the small
presets, CPU-size), and benchmarks of speed and memory at a model's real size (the config
presets), not of pictures.

    ditax init-random ltx2-tiny --out ltx2-random          # any family's small preset
    ditax init-random --list                               # the small presets
    python -m ditax.recipes.random_pipeline --preset wan2.1-t2v-1.3b --out Wan-1.3B-random
    python -m ditax.recipes.random_pipeline --preset tiny --out tiny-random     # seconds, tests

The folder is what diffusers' ``save_pretrained`` of the family's pipeline writes and what
``ditax generate --model DIR``, ``ditax.load_pipeline(DIR)`` and ``ditax serve --model DIR``
load: ``model_index.json``, one subfolder per component (the transformer at the preset's real
size under diffusers' keys — wan2.1-t2v-1.3b: 1,418,996,800 parameters, 2.8 GB in bfloat16 —
the text encoders of the width the transformer reads cut to ``--text-layers`` blocks, the VAEs
at their real size or ``--vae small``, tokenizers ditax reads offline), ``ditax_sample.json``
(a 4-step call, guidance off where the family allows), ``ditax_random.json`` (what is random
and what was cut) and ``ditax_config.yaml`` (the run config of the folder's model). Which
components and presets a family has is the family's declaration
(:mod:`ditax.recipes.random_folders`); the weights are drawn and written by
:mod:`ditax.recipes.random_parts` (host memory near a few tensors whatever the size).
"""

from __future__ import annotations

import argparse
import json
import sys

# the drawing and writing pieces, under the names this module has always had (re-exported)
from ditax.recipes.random_parts import (DTYPES, SHARD_BYTES, Part, draw, header,  # noqa: F401
                                        init_std, shards, upstream_tensors, write_part)

#: the Wan presets of this module's own ``plan`` (text-to-video, one transformer, the Wan 2.1
#: VAE); ``ditax init-random`` takes every family's
PRESETS = ("tiny", "wan2.1-t2v-1.3b", "wan2.1-t2v-14b")
_header = header


def tokenizer_folder():
    """The shipped demo model's tokenizer (a word-level T5-style tokenizer, offline)."""
    from ditax.demo import model_path

    return model_path() / "tokenizer"


def tokenizer_vocab(folder) -> int:
    import pathlib

    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(pathlib.Path(folder) / "tokenizer.json")).get_vocab_size()


def plan(preset: str, *, text_layers: int = 2, dtype: str = "bfloat16", vae: str | None = None
         ) -> list[Part]:
    """The weight folders of Wan text-to-video ``preset`` (one of :data:`PRESETS`; nothing
    written, no weights made), the transformer first."""
    from ditax.errors import ConfigError
    from ditax.recipes.random_folders import plan as plan_folder

    if preset not in PRESETS:
        raise ConfigError(f"preset {preset!r}: this plan lists {', '.join(PRESETS)} "
                          f"(Wan text-to-video, one transformer, the Wan 2.1 VAE); ditax "
                          f"init-random {preset} writes every family's")
    return plan_folder(preset, text_layers=text_layers, dtype=dtype, vae=vae)[1].parts


def parse_size(text: str) -> tuple[int, int, int]:
    try:
        h, w, f = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not HEIGHTxWIDTHxFRAMES, e.g. "
                                         f"480x832x81") from None
    return h, w, f


def add_options(p: argparse.ArgumentParser) -> None:
    """The options ``ditax init-random`` and ``python -m ditax.recipes.random_pipeline``
    share (the preset is each one's own)."""
    p.add_argument("--out", default=None, help="the pipeline folder to write (new or empty)")
    p.add_argument("--text-layers", type=int, default=None,
                   help="text encoder blocks (default 2; FLUX.2: as deep as the layers it "
                        "reads)")
    p.add_argument("--dtype", default=None, choices=tuple(DTYPES),
                   help="transformer and text encoder weights (small presets: float32, "
                        "others: bfloat16; VAEs: float32)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vae", choices=("full", "small"), default=None,
                   help="full: the model's VAE (default for config presets); small: its "
                        "factors at a fraction of its width (default for small presets)")
    p.add_argument("--size", type=parse_size, default=None, metavar="HxWxF",
                   help="ditax_sample.json's height, width, frames (default: the preset's "
                        "sample size)")
    p.add_argument("--threads", type=int, default=None, help="drawing threads (all cores)")
    p.add_argument("--dry-run", action="store_true",
                   help="print each part's tensors, parameters and bytes; write nothing")


def execute(preset: str, overrides, a, say=print) -> None:
    """Plan (``--dry-run``: print each part) or write ``preset``'s folder from the parsed
    options ``a``; a bad request raises :class:`~ditax.errors.DitaxError`."""
    from ditax.errors import ConfigError
    from ditax.recipes import random_folders

    if a.out is None and not a.dry_run:
        raise ConfigError("--out DIR is required (the pipeline folder to write; or --dry-run)")
    cfg, folder = random_folders.plan(preset, overrides, text_layers=a.text_layers,
                                      dtype=a.dtype, vae=a.vae, size=a.size)
    if a.dry_run:
        for part in folder.parts:
            print(json.dumps({"part": part.name, "tensors": len(part.tensors),
                              "parameters": part.params, "bytes": part.nbytes,
                              "dtype": part.dtype}))
        return
    random_folders.write(a.out, preset, cfg, folder, seed=a.seed, threads=a.threads, say=say)


def main(argv=None) -> int:
    prog = "python -m ditax.recipes.random_pipeline"
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="wan2.1-t2v-1.3b",
                   help="a small preset (ditax init-random --list) or a config preset")
    add_options(p)
    p.add_argument("overrides", nargs="*", default=[], help="key=value config overrides")
    a = p.parse_args(argv)
    from ditax.errors import DitaxError

    try:
        execute(a.preset, a.overrides, a)
    except DitaxError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
