"""The sampling request every entry builds the same way: typed fields, one validation.

A request is the pipeline call's keyword values (:class:`SampleRequest`), made of fields
(:class:`Field`): the ones every family takes (:data:`COMMON`: prompt, negative prompt, size,
steps, guidance, seed) and those a family declares
(:attr:`~ditax.pipelines.family.PipelineFamily.fields`: Wan's ``num_frames`` and
``guidance_scale_2``, FLUX.1's ``true_cfg_scale``, a third family's own). A field carries its
type, its limits, the CLI flag ``ditax generate`` shows it as, and the JSON name ``ditax serve``
accepts, so:

- ``ditax generate`` adds one flag per field of every known family (:func:`add_flags`), and a
  flag the folder's family does not declare is refused in one line naming the family;
- ``ditax serve`` accepts the JSON fields of its model's family, and refuses the others;
- every value, from either, is checked by :func:`check_value` before any work: a bool is not a
  number, a string is not a number, ``17.0`` is not an int, NaN / inf are not finite, and the
  limits hold; the message names the value as the user wrote it (``--guidance nan`` on the
  CLI, ``guidance_scale`` on the server, the keyword in Python).

Light (no JAX): the CLI builds its parser from these before anything heavy is imported.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

from ditax.errors import RequestError
from ditax.intmath import INT_LIMIT
from ditax.pipelines.seeds import check_seed

KINDS = ("int", "float", "str")
SURFACES = ("cli", "api", "python")


@dataclass(frozen=True)
class Field:
    """One request field.

    ``name``: the pipeline call's keyword (and the key a server's job stores); ``kind``: ``int``,
    ``float`` or ``str``; ``optional``: None is a value (``negative_prompt``); ``minimum`` /
    ``maximum``: inclusive bounds; ``flag``: the ``ditax generate`` flag (None:
    ``--name-with-dashes``; ``""``: not on the CLI); ``json``: the ``ditax serve`` field (None:
    ``name``; ``""``: not on the API); ``limit``: the name of the server limit that bounds it
    (:class:`ditax.serve.requests.Limits`); ``per_row``: the value may differ between the rows
    of one batch (prompt, seed), so it is not part of a batch's program shape; ``example``: a
    good value, shown in fixes; ``rule``: a function ``rule(value, name=shown name)`` for what
    bounds cannot say (raises :class:`~ditax.errors.RequestError`)."""

    name: str
    kind: str
    help: str = ""
    optional: bool = False
    minimum: float | None = None
    maximum: float | None = None
    flag: str | None = None
    json: str | None = None
    limit: str | None = None
    per_row: bool = False
    example: Any = None
    metavar: str | None = None
    rule: Any = None       # rule(value, name=...) raising RequestError, after the type check

    def __post_init__(self):
        if self.kind not in KINDS:
            raise TypeError(f"Field {self.name!r}: kind={self.kind!r} must be one of {KINDS}")

    @property
    def cli(self) -> str:
        """The ``ditax generate`` flag (``""``: none)."""
        return "--" + self.name.replace("_", "-") if self.flag is None else self.flag

    @property
    def dest(self) -> str:
        """The argparse attribute of :attr:`cli`."""
        return self.cli[2:].replace("-", "_")

    @property
    def api(self) -> str:
        """The ``ditax serve`` JSON field (``""``: none)."""
        return self.name if self.json is None else self.json

    def shown(self, surface: str) -> str:
        """How the user named this field on ``surface`` (``cli``, ``api``, ``python``)."""
        if surface == "cli" and self.cli:
            return self.cli
        if surface == "api" and self.api:
            return self.api
        return self.name


# the fields every family's request has
COMMON: tuple[Field, ...] = (
    Field("prompt", "str", "what to generate", per_row=True, example="a cat walks on the grass"),
    Field("negative_prompt", "str", "what to steer away from (with guidance)", optional=True,
          per_row=True),
    Field("height", "int", "pixels (the family's grid; default: the folder's, else the "
          "family's)", minimum=1, maximum=INT_LIMIT - 1, json="", limit="max_pixels"),
    Field("width", "int", "pixels (the family's grid; default: the folder's, else the "
          "family's)", minimum=1, maximum=INT_LIMIT - 1, json="", limit="max_pixels"),
    Field("num_inference_steps", "int", "denoising steps (default: the folder's, else the "
          "family's)", minimum=1, maximum=INT_LIMIT - 1, flag="--steps", limit="max_steps",
          example=20),
    Field("guidance_scale", "float", "CFG scale (<= 1: off), or a guidance-distilled model's "
          "embedded guidance (FLUX.1-dev, FLUX.2-dev); the folder's family says which",
          minimum=0.0, flag="--guidance", example=5.0),
    Field("seed", "int", "noise seed, 0 <= SEED < 2**32 (jax's PRNGKey keeps 32 bits)",
          per_row=True, example=0, rule=check_seed),
)


def _number(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _integral(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _literal(v, surface: str) -> str:
    """A value as the user wrote it: JSON words on the server, Python's repr elsewhere."""
    if surface == "api":
        if isinstance(v, bool):
            return "true" if v else "false"
        if v is None:
            return "null"
        if isinstance(v, float) and not math.isfinite(v):
            return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
        if isinstance(v, str):
            return f'"{v}"'
    if surface == "cli" and not isinstance(v, str):
        return str(v)
    return repr(v)


def check_value(f: Field, value, surface: str = "python", example=None):
    """``value`` of field ``f`` checked and normalised (an int kind → ``int``, a float kind →
    ``float``); :class:`RequestError` naming the field as ``surface`` names it, the value as
    given, and the fix (``example``: a good value, e.g. the folder's default; else the
    field's)."""
    name = f.shown(surface)
    sep = " " if surface == "cli" and name.startswith("--") else "="
    said = f"{name}{sep}{_literal(value, surface)}"
    if value is None:
        if f.optional:
            return None
        raise RequestError(f"{name} is required ({f.help or f.kind})")
    example = example if example is not None else f.example
    example = f" (e.g. {example})" if example is not None else ""
    if f.kind == "str":
        if not isinstance(value, str):
            raise RequestError(f"{said} must be a string{example}")
        return value
    if isinstance(value, bool):
        raise RequestError(f"{said} must be a number, not a boolean{example}")
    if isinstance(value, str):
        what = "an integer" if f.kind == "int" else "a number"
        raise RequestError(f"{said} must be {what}, not a string; write it without quotes"
                           f"{example}")
    if not _number(value):
        raise RequestError(f"{said} must be {'an integer' if f.kind == 'int' else 'a number'}"
                           f"{example}")
    if f.kind == "int":
        if not _integral(value):
            hint = (f"; write {int(value)}" if isinstance(value, float) and math.isfinite(value)
                    and float(value).is_integer() else example)
            raise RequestError(f"{said} must be an integer{hint}")
        value = int(value)
    else:
        if not math.isfinite(float(value)):
            raise RequestError(f"{said} must be a finite number{example}")
        value = float(value)
    if f.rule is not None:
        f.rule(value, name=name)
    lo, hi = f.minimum, f.maximum
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        big = hi == INT_LIMIT - 1       # a bound only against int32 overflow: not shown
        span = (f">= {lo}" if hi is None else f"<= {hi}" if lo is None else
                f">= {lo}" if big and value < lo else "below 2**31 (int32)" if big else
                f"in [{lo}, {hi}]")
        raise RequestError(f"{said} must be {span}{example}")
    return value


def check_prompt(prompt, surface: str = "python", name: str | None = None) -> None:
    """A prompt is a string with some text in it."""
    shown = name or {"cli": "--prompt"}.get(surface, "prompt")
    if not isinstance(prompt, str):
        raise RequestError(f"{shown} must be a string, got {type(prompt).__name__}")
    if not prompt.strip():
        raise RequestError(f"{shown} is empty; describe what to generate, e.g. "
                           f"{shown}{' ' if shown.startswith('--') else '='}"
                           f"'a cat walks on the grass'")


@dataclass(frozen=True)
class SampleRequest:
    """A checked request: ``family`` (the family's name) and ``values`` (the pipeline call's
    keyword values, every field of the family set: the caller's, else the defaults)."""

    family: str
    values: dict

    def call(self) -> dict:
        """The pipeline call's keyword arguments."""
        return dict(self.values)


def fields_of(pipelines) -> tuple[Field, ...]:
    """The request fields of a family's pipelines: :data:`COMMON` then its own."""
    return COMMON + tuple(getattr(pipelines, "fields", ()))


def all_fields() -> dict[str, tuple[Field, list[str]]]:
    """Every field of every known family, by name: ``(field, [families declaring it])``
    (the common ones under every family)."""
    from ditax.pipelines.family import known_pipelines

    out: dict[str, tuple[Field, list[str]]] = {f.name: (f, ["*"]) for f in COMMON}
    for name, pipes in known_pipelines():
        for f in getattr(pipes, "fields", ()):
            out.setdefault(f.name, (f, []))[1].append(name)
    return out


def flag_help(name: str) -> str:
    """The ``ditax generate`` help of field ``name``: its help and, for a family's own field,
    whose it is; where the families declaring it say different things (their own rules:
    Wan's ``4k+1`` frames, LTX-2's ``8k+1``), each family's help, named."""
    from ditax.pipelines.family import known_pipelines

    f, families = all_fields()[name]
    if families == ["*"]:
        return f.help
    own = [(fam, g.help) for fam, pipes in known_pipelines()
           for g in getattr(pipes, "fields", ()) if g.name == name]
    whose = f" [{', '.join(families)} models]"
    if len({h for _, h in own}) <= 1:
        return f"{f.help}{whose}"
    return "; ".join(f"{fam}: {h}" for fam, h in own) + whose


def not_taken(pipelines, shown: str, attr: str, value, context: str = "") -> RequestError:
    """The one refusal of a field (or flag) ``pipelines``' family does not take: ``shown`` as
    the user named it, ``context`` in brackets after the family, and — where another family
    declares a field whose ``attr`` (``name``, ``api``, ``dest``) is ``value`` — the families
    it belongs to."""
    owners = next((fams for f, fams in all_fields().values()
                   if getattr(f, attr) == value and fams != ["*"]), None)
    whose = f"; it is for {', '.join(owners)} models" if owners else ""
    context = f" ({context})" if context else ""
    return RequestError(f"{shown} is not taken by {pipelines.name} models{context}{whose} — "
                        f"drop it")


def build_request(pipelines, given: dict, defaults: dict, surface: str = "python",
                  folder=None) -> SampleRequest:
    """The :class:`SampleRequest` of ``given`` (field name → value; None = not given) for
    ``pipelines``' family: a field of another family is refused naming this one (``folder``:
    the model folder, named in that message), each given value checked
    (:func:`check_value`), the rest taken from ``defaults`` (field name → value: the folder's
    file, else the family's), the prompt checked for text."""
    own = {f.name: f for f in fields_of(pipelines)}
    family = getattr(pipelines, "name", "?")
    for key, value in given.items():
        if value is None or key in own:
            continue
        known = all_fields().get(key)
        raise not_taken(pipelines, known[0].shown(surface) if known else key, "name", key,
                        f"{folder} is a {family} folder" if folder else "")
    values = {}
    for name, f in own.items():
        if given.get(name) is not None:
            values[name] = check_value(f, given[name], surface, defaults.get(name))
        else:
            values[name] = check_value(f, defaults.get(name), "python") \
                if defaults.get(name) is not None else None
    check_prompt(values.get("prompt"), surface)
    return SampleRequest(family, values)


__all__ = ["COMMON", "Field", "SampleRequest", "all_fields", "build_request",
           "flag_help", "not_taken",
           "check_prompt", "check_value", "fields_of"]
