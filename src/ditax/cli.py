"""``ditax`` command line: thin wrappers that parse into config and call library functions.

Subcommands register themselves lazily (so ``ditax --help`` does not import torch-free heavy
modules it does not need): each entry maps a name to ``module`` exposing ``add_arguments(p)``
and ``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = {
    "generate": ("ditax.pipelines.generate", "text → video with a Wan pipeline folder"),
    "train": ("ditax.train.cli", "flow-matching training / fine-tuning"),
    "preprocess": ("ditax.train.preprocess", "videos + captions → latent dataset"),
    "convert": ("ditax.models.wan.convert_cli", "check / convert a diffusers transformer folder"),
    "bench": ("ditax.bench", "quick forward benchmark of a config"),
    "plan": ("ditax.plan", "show mesh, shardings and per-device memory for a config"),
}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="ditax", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = {}
    wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, (mod, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_)
        if name == wanted:
            try:
                modules[name] = importlib.import_module(mod)
            except ModuleNotFoundError as e:
                if e.name and e.name.startswith("ditax"):
                    print(f"ditax {name}: not available in this build ({e.name})", file=sys.stderr)
                    return 2
                raise
            modules[name].add_arguments(p)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 1
    return int(modules[args.command].run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
