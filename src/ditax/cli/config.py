"""``ditax config [CONFIG] [key=value ...] [--vae]``: the config sections and keys, their values
and defaults, and the presets.

Without CONFIG it lists every key of ``ditax train`` with its default; with a preset name or
YAML path (and overrides) the values that config resolves to, the default beside each value
that differs. ``--vae``: the keys of ``ditax train-vae`` instead (``--family``: that family's
VAE trainer, as ``ditax train-vae --family``; default Wan). Everything shown is read from
the config dataclasses (:class:`ditax.config.Config`, the model family's config,
the family VAE trainer's config class): names, types, defaults, and the comment
written beside a field in its source, so the listing cannot go stale. Nothing heavy loads.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import textwrap
import types
import typing
from typing import Any, Literal

from ditax.config.keys import value_text

_FIELD_COMMENT = re.compile(r"^\s*(\w+)\s*:[^#]*#\s?(.*\S)\s*$")
# a comment ending in one of these goes on in the next field's comment (one note for both)
_DANGLING = {"the", "a", "an", "of", "to", "and", "or", "by", "with", "for", "in", "is", "="}
WIDTH = 100


def add_arguments(p) -> None:
    p.description = __doc__.split("\n\n")[0]
    p.add_argument("config", nargs="?", default=None,
                   help="preset name or YAML file to show (default: the built-in defaults)")
    p.add_argument("overrides", nargs="*", default=[], help="key=value overrides to apply")
    p.add_argument("--vae", action="store_true",
                   help="the keys of `ditax train-vae` instead of `ditax train`")
    p.add_argument("--family", default=None,
                   help="with --vae: the model family whose VAE trainer's keys are listed "
                   "(default: wan; as `ditax train-vae --family`)")


def run(args) -> int:
    config, overrides = args.config, list(args.overrides)
    if config is not None and "=" in config:          # no config, only overrides
        config, overrides = None, [config, *overrides]
    if args.family and not args.vae:
        from ditax.errors import RequestError

        raise RequestError(f"--family {args.family} goes with --vae (the keys of `ditax "
                           f"train-vae --family {args.family}`); `ditax train` reads the family "
                           f"from the config's model.family")
    print(render_vae(config, overrides, family=args.family) if args.vae
          else render(config, overrides))
    return 0


def render(config: str | None = None, overrides: list[str] | None = None) -> str:
    """The listing of ``ditax config [CONFIG] [overrides]`` for ``ditax train``."""
    from ditax.config import Config, load_config, validate

    # a listing never shows a value ditax train would refuse
    cfg = validate(load_config(config, overrides), training=True)
    default = dataclasses.replace(Config(), model=type(cfg.model)())
    head = (f"ditax train {config or 'CONFIG'}: " + ("the values of this config (default "
            "in brackets where it differs)" if config or overrides else "every config key "
            "and its default") + "; set them as key=value after the config or in its YAML "
            "sections (model: {num_layers: 2})")
    return "\n".join([*textwrap.wrap(head, WIDTH), "", *_rows(cfg, default), "", *_presets()])


def render_vae(config: str | None = None, overrides: list[str] | None = None,
               family: str | None = None) -> str:
    """The listing of ``ditax config --vae [--family F] [CONFIG] [overrides]`` for ``ditax
    train-vae --family F`` (default family: Wan)."""
    import pathlib

    from ditax.config import preset_names
    from ditax.errors import RequestError
    from ditax.models.base import DEFAULT_FAMILY, family_class

    trainer = family_class(family or DEFAULT_FAMILY).trainer("vae")
    VAETrainConfig = trainer.config_class

    if config and config in preset_names() and not pathlib.Path(config).is_file():
        raise RequestError(f"{config!r} is a `ditax train` preset (ditax config {config}); "
                           f"--vae reads a YAML file of train-vae keys, or key=value only")
    shown = config or overrides
    cfg = (trainer.load_config(config, overrides, listing=True) if shown
           else VAETrainConfig())
    fam = f"--family {family} " if family else ""
    head = (f"ditax train-vae {fam}{config or '[CONFIG.yaml]'}: " + ("the values of this config "
            "(default in brackets where it differs)" if shown else "every config key and its "
            "default") + "; set them as key=value or in a YAML file")
    return "\n".join([*textwrap.wrap(head, WIDTH), "", *_rows(cfg, VAETrainConfig())])


def leaves(obj, prefix: str = "") -> dict[str, tuple[Any, Any, str]]:
    """``{"mesh.fsdp": (value, annotation, comment), ...}`` for every leaf of a config
    dataclass instance (nested sections by their instances, so ``model`` is the family's)."""
    out = {}
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            out.update(leaves(value, f"{prefix}{f.name}."))
        else:
            out[prefix + f.name] = (value, hints.get(f.name), _comments(type(obj)).get(f.name, ""))
    return out


def _rows(cfg, default) -> list[str]:
    now, was = leaves(cfg), leaves(default)
    sections: dict[str, list[str]] = {}
    for key, (value, tp, comment) in now.items():
        section = key.split(".")[0] if "." in key else ""
        shown = f"{key} = {value_text(value)}"
        if key in was and was[key][0] != value:
            shown += f"  [{value_text(was[key][0])}]"
        line = f"  {shown:<40} {_type(tp)}"
        lines = sections.setdefault(section, [])
        if comment and len(line) + len(comment) + 4 <= WIDTH:
            lines.append(f"{line}  # {comment}")
        else:                   # the note under its key, where it does not fit beside
            lines += [line, *textwrap.wrap(comment, WIDTH, initial_indent=" " * 6 + "# ",
                                           subsequent_indent=" " * 6 + "# ")]
    out = []
    for section, lines in sections.items():
        title = "run" if not section else section
        doc = "" if not section else _doc(type(getattr(cfg, section)))
        out += [f"[{title}]" + (f"  {doc}" if doc else ""), *lines]
    return out


def _presets() -> list[str]:
    from ditax.config import PRESET_DIR, preset_names

    out = ["presets (ditax train PRESET, ditax config PRESET):"]
    for name in preset_names():
        out.append(f"  {name:<22} {_preset_summary(PRESET_DIR / f'{name}.yaml')}")
    return out


def _preset_summary(path) -> str:
    """The first sentence of the comment a preset file starts with."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("# ").strip())
    text = " ".join(lines)
    end = re.search(r"\.(\s|$)", text)
    return textwrap.shorten(text[:end.start() + 1] if end else text, WIDTH - 25,
                            placeholder=" ...")


def _comments(cls) -> dict[str, str]:
    """The comment written beside each field (``name: T = v  # this``) in the source of the
    class that declares it: ``cls`` or a class it extends (a family's config takes its shared
    fields from :class:`ditax.models.common.fields.TransformerNumerics`)."""
    out: dict[str, str] = {}
    for base in reversed(cls.__mro__):
        out.update(_own_comments(base))
    return out


@functools.cache
def _own_comments(cls) -> dict[str, str]:
    """The comments beside the fields written in ``cls``'s own source."""
    out: dict[str, str] = {}
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return out
    run: list[str] = []          # fields sharing a comment that runs over several lines
    for line in source.splitlines():
        m = _FIELD_COMMENT.match(line)
        if not m or m.group(1) in out:
            run = []
            continue
        name, text = m.groups()
        if run:
            text = f"{out[run[0]]} {text}"
        run.append(name)
        for n in run:
            out[n] = text
        if text.split()[-1].lower() not in _DANGLING:
            run = []
    return out


def _doc(cls) -> str:
    doc = inspect.getdoc(cls) or ""
    if doc.startswith(f"{cls.__name__}("):      # dataclass' generated signature: no docstring
        return ""
    return textwrap.shorten(doc.split("\n\n")[0].replace("``", "`"), 90, placeholder=" ...")


def _type(tp) -> str:
    """A short type: ``int``, ``xla|splash|...``, ``int|none``, ``list of 3``."""
    if tp is None or tp is Any:
        return ""
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        text = "|".join(_type(a) for a in inner)
        return text + ("|none" if len(inner) < len(args) else "")
    if typing.get_origin(tp) is Literal:
        return "|".join(value_text(a) for a in args)
    if typing.get_origin(tp) is tuple:
        return "list" if ... in args else f"list of {len(args)}"
    return getattr(tp, "__name__", str(tp))


__all__ = ["add_arguments", "run", "render", "render_vae", "leaves"]
