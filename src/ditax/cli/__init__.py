"""``ditax`` command line: thin commands that parse into config and call library functions.

One module a command (``ditax.cli.generate``, ``train``, ``train_vae`` for ``train-vae``,
``preprocess``, ``convert``, ``export``, ``bench``, ``plan``, ``calibrate_cache`` for
``calibrate-cache``, ``config``, ``init_random`` for ``init-random``), each exposing
``add_arguments(parser)`` and ``run(args) -> int``; their ``--help`` ends with the examples
of :mod:`ditax.cli.examples`. Only the module of the command asked for is imported, so
``ditax --help`` does not start JAX.

Exit codes: 0 ok; 2 a bad request or config (any :class:`ditax.errors.DitaxError`, or a usage
error), checked before anything heavy loads where it can be; 1 a runtime failure. A mistake the
user can fix prints one line ``ditax COMMAND: error: MESSAGE`` on stderr and no traceback;
``ditax --debug COMMAND ...`` prints the traceback too.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback

from ditax.errors import DitaxError, NonFiniteOutput, RequestError, request_errors  # noqa: F401
from ditax.front.folder import SHIPPED_MODELS, model_path  # noqa: F401  (light: no JAX)
from ditax.io.outputs import WriteFailed   # light: no JAX (ditax --help starts none)

COMMANDS = {
    "generate": "prompt → video (Wan, LTX-2 with sound) or image (FLUX.1, FLUX.2) with a model "
                "folder; --prompts FILE",
    "train": "flow-matching training / fine-tuning",
    "train-vae": "train a VAE (Wan's AutoencoderKLWan; --family flux: AutoencoderKL) on clips",
    "preprocess": "videos + captions → latent dataset",
    "convert": "check a transformer folder; single-file checkpoint → diffusers folder",
    "export": "a training run's checkpoint → diffusers pipeline folder",
    "bench": "quick forward benchmark of a config",
    "plan": "show mesh, shardings and per-device memory for a config",
    "calibrate-cache": "measure a model's step-cache numbers (TeaCache, MagCache)",
    "config": "list the config keys with their defaults (or a preset's values) and the presets",
    "serve": "serve a model over HTTP: /v1/videos jobs (videos or images), a durable queue, "
             "a web page",
    "init-random": "a random-weight pipeline folder of any family (no download, no torch)",
}

USAGE, FAILURE = 2, 1


class UsageError(DitaxError):
    """The command line itself is wrong (unknown flag, missing argument); exit 2."""


class CommandFailed(Exception):
    """A command's work failed for a reason its message explains (exit 1, no traceback)."""


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors raise :class:`UsageError` instead of exiting, so
    ``main`` prints them in its one-line form and returns the exit code."""

    def error(self, message):
        raise UsageError(message)


# ``--model`` as a path (``demo`` / ``flux-demo``: the shipped folders), the front door's rule
model_arg = model_path


def latent_arg(text: str) -> tuple[int, int, int]:
    """argparse type of ``--latent F,Y,X``: three positive ints (latent frames, height, width)."""
    try:
        dims = tuple(int(v) for v in text.split(","))
    except ValueError:
        dims = ()
    if len(dims) != 3 or min(dims) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not F,Y,X (three positive integers, "
                                         f"e.g. 5,32,32)")
    return dims


def build_parser(wanted: str | None) -> tuple[Parser, Parser | None, object]:
    """The top parser, and for the command ``wanted`` its parser and module (the only command
    module imported)."""
    from ditax.cli.examples import epilog, top_epilog

    parser = Parser(prog="ditax", description="Video and image diffusion transformers in JAX "
                    f"(Wan 2.1 / 2.2 and LTX-2 video, FLUX.1 and FLUX.2 images): "
                    f"{', '.join(COMMANDS)}.",
                    epilog=top_epilog(COMMANDS),
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--debug", action="store_true",
                        help="print the traceback of an error")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    cmd_parser = module = None
    for name, help_ in COMMANDS.items():
        p = sub.add_parser(name, help=help_, epilog=epilog(name),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        if name == wanted:
            p.add_argument("--debug", action="store_true", help="print the traceback of an error")
            module = importlib.import_module(f"ditax.cli.{name.replace('-', '_')}")
            module.add_arguments(p)
            if p.description:           # a module docstring's reST quotes read as plain text
                p.description = p.description.replace("``", "")
            cmd_parser = p
    return parser, cmd_parser, module


def one_line(text: str) -> str:
    """A message as one line: its lines joined (a traceback-free report stays greppable)."""
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


def main(argv=None) -> int:
    """Run ``ditax`` with ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # before JAX starts a TPU backend: the scoped-VMEM limit the attention kernels' large
    # tiles need (unless LIBTPU_INIT_ARGS sets one; ditax.tpu_env, ditax.attention.tuning)
    from ditax.tpu_env import raise_scoped_vmem

    raise_scoped_vmem()
    wanted = next((a for a in argv if not a.startswith("-")), None)
    debug = "--debug" in argv
    prog = f"ditax {wanted}" if wanted in COMMANDS else "ditax"
    try:
        parser, cmd_parser, module = build_parser(wanted)
        at = argv.index(wanted) if wanted in COMMANDS else len(argv)
        if cmd_parser is None or set(argv[:at]) - {"--debug"}:
            parser.parse_args(argv)      # help, or the error naming the bad command / flag
            raise UsageError(f"no command given; choose one of {', '.join(COMMANDS)}")
        # flags and key=value overrides may come in any order after the command
        args = cmd_parser.parse_intermixed_args(argv[at + 1:])
        args.command, args.debug = wanted, debug
        from ditax.cli.quiet import quiet_libtpu

        with quiet_libtpu():               # libtpu's chip probing kept off a CPU's stderr
            return int(module.run(args) or 0)
    except SystemExit as e:            # --help / --version print and stop here
        return 0 if e.code is None else e.code if isinstance(e.code, int) else FAILURE
    except UsageError as e:
        return _report(prog, f"{e} (see {prog} --help)", USAGE, debug)
    except DitaxError as e:
        return _report(prog, str(e), USAGE, debug)
    except (CommandFailed, NonFiniteOutput, WriteFailed) as e:   # failures their message explains
        return _report(prog, str(e), FAILURE, debug)
    except KeyboardInterrupt:
        return _report(prog, "interrupted", 130, debug)
    except Exception as e:  # noqa: BLE001 — anything else is a failure, reported in one line
        from ditax.cli.oom import is_out_of_memory, oom_message

        if is_out_of_memory(e):        # which phase, and what to lower (ditax.cli.oom)
            return _report(prog, oom_message(e, wanted), FAILURE, debug)
        hint = "" if debug else "; rerun with --debug for the traceback"
        return _report(prog, f"{type(e).__name__}: {e}{hint}", FAILURE, debug)


def _report(prog: str, message: str, code: int, debug: bool) -> int:
    if debug:
        traceback.print_exc()
    print(f"{prog}: error: {one_line(message)}", file=sys.stderr)
    return code
