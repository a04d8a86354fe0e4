"""``ditax init-random PRESET --out DIR [key=value ...]``: a pipeline folder of any family with
random weights, in the family's own format (diffusers' folder layout, tokenizers included),
with nothing downloaded and no torch: to try generate, serve, train and plan on a family
without its weights.

PRESET is a small preset (CPU-size, seconds to write: ``--list`` shows each family's — Wan
text-to-video, image-to-video, TI2V, VACE and Animate, FLUX.1, FLUX.2 klein and dev, LTX-2)
or a config preset / YAML (``ditax config``; the transformer at its real size, for speed and
memory measurements); ``key=value`` overrides change the model (``model.num_layers=4``). The
folder holds ``ditax_sample.json`` (a 4-step call at the preset's sample size),
``ditax_random.json`` (what is random and what was cut) and ``ditax_config.yaml`` (its run
config: ``ditax plan DIR/ditax_config.yaml``, ``ditax train DIR/ditax_config.yaml
init_from=DIR``). The outputs are noise: the weights are random.
"""

from __future__ import annotations


def add_arguments(p) -> None:
    from ditax.recipes.random_pipeline import add_options

    p.description = __doc__.split("\n\n")[0]
    p.add_argument("preset", nargs="?", default=None,
                   help="small preset (--list) or config preset / YAML path")
    p.add_argument("overrides", nargs="*", default=[],
                   help="key=value config overrides, e.g. model.num_layers=4")
    p.add_argument("--list", action="store_true",
                   help="list the small presets of every family and exit")
    add_options(p)


def listing() -> str:
    """The small presets, one line each: name, family, what it is."""
    from ditax.recipes.random_folders import small_presets

    rows = [(name, hook.family, p.what) for name, (hook, p) in small_presets().items()]
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"{n:{width}s}  {f:6s} {w}" for n, f, w in rows)


def run(args) -> int:
    from ditax.cli import UsageError
    from ditax.recipes.random_pipeline import execute

    if args.list:
        print(listing())
        return 0
    if args.preset is None:
        raise UsageError("give a PRESET (ditax init-random --list shows the small ones)")
    if "=" in args.preset:
        raise UsageError(f"{args.preset!r} is an override; give the PRESET first "
                         f"(ditax init-random PRESET --out DIR key=value)")
    execute(args.preset, list(args.overrides), args)
    return 0
