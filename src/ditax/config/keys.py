"""Dotted config keys (``mesh.fsdp``), their annotated types, and the messages about them.

The key table is derived from the dataclass annotations, so it is never written by hand:
:func:`key_types` lists every leaf key of :class:`~ditax.config.schema.Config` with the
``model.*`` keys of the chosen model family. :func:`parse_text` turns one ``key=value`` text
into a value for the type (``none`` for Optional fields, ``1,2,2`` for tuples, words kept as
typed for string / Literal fields); the type checks themselves are pydantic's.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import types
import typing
from typing import Any, Literal

import yaml

from ditax.config.schema import Config
from ditax.errors import ConfigError, check_choice

_NONE_WORDS = ("none", "null", "~")


def leaf_types(cls, prefix: str = "") -> dict[str, Any]:
    """``{dotted key: annotation}`` of every leaf field of dataclass ``cls`` (nested
    dataclass fields are sections; class constants, ``ClassVar`` s, are no keys)."""
    out = {}
    hints = typing.get_type_hints(cls)
    for name in (f.name for f in dataclasses.fields(cls)):
        tp = hints[name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            out.update(leaf_types(tp, f"{prefix}{name}."))
        else:
            out[prefix + name] = tp
    return out


@functools.cache
def key_types(model_cls: type) -> dict[str, Any]:
    """``{"mesh.fsdp": int, "model.remat": Literal[...], ...}`` for a model family's config."""
    out = {k: v for k, v in leaf_types(Config).items() if k != "model"}
    out.update(leaf_types(model_cls, "model."))
    return out


def check_key(key: str, types_: dict[str, Any]) -> None:
    """Raise :class:`ConfigError` unless ``key`` is a leaf key (close matches suggested)."""
    if key in types_:
        return
    section = [k for k in types_ if k.startswith(key + ".")]
    if section:
        raise ConfigError(f"{key!r} names a section; set one of its keys, e.g. "
                          f"{', '.join(section[:3])}")
    close = difflib.get_close_matches(key, list(types_), n=3, cutoff=0.5)
    if not close:  # also match on the last component (e.g. "fsdp" -> "mesh.fsdp")
        last = key.split(".")[-1]
        close = [k for k in types_ if k.split(".")[-1] == last][:3]
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise ConfigError(f"unknown config key {key!r}{hint}")


def _strip_optional(tp) -> tuple[Any, bool]:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0], len(args) < len(typing.get_args(tp))
    return tp, False


def _words(tp) -> tuple:
    """The Literal words of a union type (``tuple[int, int, int] | Literal["auto"]``)."""
    if typing.get_origin(tp) not in (typing.Union, types.UnionType):
        return ()
    return tuple(w for a in typing.get_args(tp) if typing.get_origin(a) is Literal
                 for w in typing.get_args(a))


def choices(tp) -> tuple | None:
    """The allowed values of a ``Literal`` (or ``Optional[Literal]``) type, else None."""
    inner, _ = _strip_optional(tp)
    return typing.get_args(inner) if typing.get_origin(inner) is Literal else None


def parse_text(raw: str, tp) -> Any:
    """The value of ``key=raw`` for a field annotated ``tp`` (type checks come later)."""
    inner, optional = _strip_optional(tp)
    text = raw.strip()
    if optional and text.lower() in _NONE_WORDS:
        return None
    if text in _words(tp):          # a word of a union's Literal (attention.tile=auto)
        return text
    if typing.get_origin(inner) is tuple:
        text = "[" + text.strip("[]()") + "]"
    try:
        value = yaml.safe_load(text) if text else ""
    except yaml.YAMLError:
        return raw
    allowed = choices(inner)
    textual = inner is str or (allowed is not None and all(isinstance(c, str) for c in allowed))
    return raw if textual and not isinstance(value, str) else value


def describe(tp) -> str:
    """What a value of type ``tp`` looks like, for error messages."""
    inner, optional = _strip_optional(tp)
    text = {bool: "a boolean (true/false)", int: "an integer", float: "a number",
            str: "a string"}.get(inner)
    if text is None and typing.get_origin(inner) is tuple:
        n = len(typing.get_args(inner))
        text = f"a list of {n} values like 1,2,2" if n == 3 else f"a list of {n} values"
        text += "".join(f" or {w}" for w in _words(tp))
    text = text or f"a value of type {inner}"
    return text + (" or none" if optional else "")


def type_error(key: str, value: Any, tp) -> ConfigError:
    """The :class:`ConfigError` for ``key=value`` not fitting ``tp`` (did-you-mean for Literals)."""
    allowed = choices(tp)
    if allowed is not None:
        try:
            check_choice(key, value, allowed)
        except ConfigError as e:
            return e
    return ConfigError(f"{key}={value!r}: expected {describe(tp)}")


def value_text(value) -> str:
    """A config value as a ``key=value`` text spells it, the inverse of :func:`parse_text`:
    ``none``, ``true`` / ``false``, ``1,2,2`` for tuples (``[]`` when empty), ``""`` for an
    empty string."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (tuple, list)):
        return ",".join(value_text(v) for v in value) if value else "[]"
    return str(value) if value != "" else '""'


__all__ = ["key_types", "check_key", "choices", "parse_text", "value_text", "describe",
           "type_error"]
