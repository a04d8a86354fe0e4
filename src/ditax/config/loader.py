"""YAML presets + ``key=value`` overrides → a frozen, type-checked :class:`Config`.

``load_config("tiny", ["mesh.fsdp=8", "attention.backend=ulysses"])`` reads a preset (or a YAML
path; ``base: other`` inherits from another preset), applies the dotted overrides, and builds
the frozen dataclasses through pydantic, which checks every annotation (``Literal`` choices,
tuples, Optional, ``"8"`` → 8) and refuses unknown keys. Errors are :class:`ConfigError` naming
the key, the value and what fits. Rules beyond types are :func:`~ditax.config.validate`'s.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import pathlib
from typing import Any

import pydantic

from ditax.config.families import ConfigFamily, config_family
from ditax.config.keys import check_key, key_types, leaf_types, parse_text, type_error
from ditax.numbers import check_numbers
from ditax.config.sample import expand_preset
from ditax.config.schema import Config
from ditax.errors import ConfigError
from ditax.io.files import read_yaml
from ditax.models.registry import DEFAULT_FAMILY

PRESET_DIR = pathlib.Path(__file__).parent / "presets"

# extra="forbid" and number → str coercion reach the nested dataclasses through the root model
_PYDANTIC = pydantic.ConfigDict(extra="forbid", coerce_numbers_to_str=True)


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def flatten_keys(d: dict, prefix: str = "") -> dict[str, Any]:
    """``{"mesh": {"fsdp": 8}}`` → ``{"mesh.fsdp": 8}`` (a non-mapping section stays a leaf)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        out.update(flatten_keys(v, key + ".") if isinstance(v, dict) else {key: v})
    return out


def nest_keys(flat: dict[str, Any]) -> dict:
    """``{"mesh.fsdp": 8}`` → ``{"mesh": {"fsdp": 8}}`` (the inverse of :func:`flatten_keys`)."""
    out: dict = {}
    for key, value in flat.items():
        *heads, last = key.split(".")
        node = out
        for h in heads:
            node = node.setdefault(h, {})
        node[last] = value
    return out


#: the run config a model folder may carry (``ditax init-random`` writes one): a folder given
#: where a config goes means it
FOLDER_CONFIG = "ditax_config.yaml"


def load_yaml(name_or_path: str, _chain: tuple = ()) -> dict:
    """A preset name, YAML path or folder holding :data:`FOLDER_CONFIG` as a nested dict, with
    its ``base:`` chain merged in
    (an unreadable file, a top level that is not a mapping or a ``base:`` cycle is a
    :class:`ConfigError` naming the file)."""
    if not isinstance(name_or_path, (str, pathlib.Path)) or not str(name_or_path).strip():
        raise ConfigError(f"config {name_or_path!r} is neither a YAML file nor a preset; "
                          f"presets: {', '.join(preset_names())}")
    p = pathlib.Path(name_or_path)
    if p.is_dir() and (p / FOLDER_CONFIG).is_file():   # a folder that carries its config
        p = p / FOLDER_CONFIG
    if not p.is_file() and (PRESET_DIR / f"{name_or_path}.yaml").is_file():
        p = PRESET_DIR / f"{name_or_path}.yaml"
    if not p.exists():
        raise ConfigError(f"config {name_or_path!r} is neither a YAML file nor a preset; "
                          f"presets: {', '.join(preset_names())}")
    if p.resolve() in _chain:
        raise ConfigError(f"config {str(p)!r}: its base: chain comes back to itself "
                          f"({' -> '.join(str(c) for c in (*_chain, p.resolve()))})")
    d = read_yaml(p, what="YAML config", fix="fix the file or give a preset name") or {}
    if not isinstance(d, dict):
        raise ConfigError(f"config {str(p)!r}: expected a mapping of sections (section: "
                          f"{{key: value}}), got a YAML {type(d).__name__}")
    bad = [k for k in d if not isinstance(k, str)]
    if bad:
        raise ConfigError(f"config {str(p)!r}: key {bad[0]!r} is not a name; sections and "
                          f"keys are words like optim: {{learning_rate: 1e-4}}")
    base = d.pop("base", None)
    if base:
        d = nest_keys({**flatten_keys(load_yaml(base, (*_chain, p.resolve()))), **flatten_keys(d)})
    return d


def split_overrides(overrides: list[str] | None) -> list[tuple[str, str]]:
    """``["mesh.fsdp=8"]`` → ``[("mesh.fsdp", "8")]`` (texts not yet parsed); a value that is
    not a list of ``key=value`` strings is a :class:`ConfigError`."""
    # a bare string would be iterated letter by letter, a dict by its keys: both refused
    if overrides is not None and not isinstance(overrides, (list, tuple)):
        raise ConfigError(f"overrides must be a list of 'key=value' strings (e.g. "
                          f"['steps=3']), got {type(overrides).__name__} {overrides!r}")
    out = []
    for item in overrides or []:
        if not isinstance(item, str):
            raise ConfigError(f"override {item!r} is not a 'key=value' string "
                              f"({type(item).__name__}); write e.g. 'mesh.fsdp=8'")
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value (e.g. mesh.fsdp=8)")
        key, raw = item.split("=", 1)
        out.append((key.strip(), raw))
    return out


@dataclasses.dataclass(frozen=True)
class _Fixed:
    """A family decided before the config is read (a model folder's), with ``origin``: why,
    for messages (``"X is a FluxPipeline folder"``)."""

    name: str
    origin: str


def _fixed(family: str | None, origin: str | None) -> _Fixed | None:
    return None if family is None else _Fixed(family, origin or f"model family {family!r}")


def _family(flat: dict[str, Any], pairs: list[tuple[str, str]],
            fixed: _Fixed | None = None) -> ConfigFamily:
    """The family (and its config class: the variant whose fields the model keys name);
    ``fixed``: the family the config is read for, which a ``model.family`` may only repeat."""
    asked = dict(pairs).get("model.family", flat.get("model.family"))
    if fixed is not None and asked is not None and str(asked).strip() != fixed.name:
        raise ConfigError(f"model.family={str(asked).strip()!r} contradicts the model: "
                          f"{fixed.origin}, a {fixed.name} model; drop model.family (it is "
                          f"read from the folder)")
    name = fixed.name if fixed is not None else DEFAULT_FAMILY if asked is None else asked
    keys = {k.split(".", 1)[1] for k in [*flat, *dict(pairs)] if k.startswith("model.")}
    return config_family(str(name).strip(), keys)


def _check_key(key: str, types_: dict[str, Any], fixed: _Fixed | None) -> None:
    """:func:`check_key`; with a ``fixed`` family an unknown ``model.*`` key is named as not
    one of that family's, with its keys."""
    if fixed is None or not key.startswith("model.") or key in types_:
        return check_key(key, types_)
    own = sorted(k for k in types_ if k.startswith("model."))
    if any(k.startswith(key + ".") for k in types_):
        check_key(key, types_)          # a section named as a key: check_key's message
    close = difflib.get_close_matches(key, own, n=2, cutoff=0.9)     # a typo, not a stranger
    raise ConfigError(f"{key} is not a key of {fixed.name} models ({fixed.origin})"
                      + (f"; did you mean {' or '.join(close)}?" if close else "")
                      + f"; its model keys are {', '.join(k[6:] for k in own)}")


def _apply(flat: dict[str, Any], pairs, types_: dict[str, Any],
           fixed: _Fixed | None = None) -> dict[str, Any]:
    flat = dict(flat)
    for key, raw in pairs:
        _check_key(key, types_, fixed)
        flat[key] = parse_text(raw, types_[key])
    return flat


def _folder_flat(family: str | None, model: dict | None) -> dict[str, Any]:
    """The dotted ``model.*`` values a folder fixes (``model``), with its ``family``."""
    if family is None:
        if model:
            raise TypeError("model= (a folder's model fields) needs family=")
        return {}
    return {"model.family": family, **{f"model.{k}": v for k, v in (model or {}).items()}}


def parse_overrides(overrides: list[str] | None, *, family: str | None = None,
                    model: dict | None = None, origin: str | None = None) -> dict:
    """``["mesh.fsdp=8", "model.remat=full"]`` → ``{"mesh": {"fsdp": 8}, "model": {...}}``
    (keys checked, values parsed for their field types, not yet validated). ``family``,
    ``model``, ``origin``: as :func:`load_config`'s (the keys are that family's)."""
    pairs = split_overrides(overrides)
    fixed = _fixed(family, origin)
    kind = _family(_folder_flat(family, model), pairs, fixed)
    return nest_keys(_apply({}, pairs, key_types(kind.config), fixed))


@functools.cache
def _root(model_cls: type) -> type[pydantic.BaseModel]:
    return pydantic.create_model(f"Root_{model_cls.__name__}", __config__=_PYDANTIC,
                                 config=(Config, ...), model=(model_cls, ...))


def from_flat(flat: dict[str, Any], family: ConfigFamily | None = None,
              given: dict[str, str] | None = None) -> Config:
    """Build a :class:`Config` from dotted keys (unknown keys and wrong types are errors;
    ``given``: the override texts, shown in messages instead of their parsed values)."""
    family = family or _family(flat, [])
    types_ = key_types(family.config)
    for key in flat:
        check_key(key, types_)
    nested = nest_keys(flat)
    model = nested.pop("model", {})
    root = _validate(_root(family.config), {"config": nested, "model": model}, flat, types_,
                     given)
    cfg = dataclasses.replace(root.config, model=root.model)
    check_numbers(cfg, given=given)
    return cfg


def _validate(root, payload: dict, flat: dict, types_: dict, given: dict | None):
    """``root.model_validate(payload)``; its first type error as a :class:`ConfigError`
    naming the dotted key and the value as given."""
    try:
        return root.model_validate(payload)
    except pydantic.ValidationError as err:
        e = err.errors()[0]
        parts = [str(p) for p in e["loc"] if isinstance(p, str)]
        parts = parts[1:] if parts[0] == "config" else parts
        # a union's member names its branch after the key (tile.tuple[int, int, int]): cut
        key = next((".".join(parts[:n]) for n in range(len(parts), 0, -1)
                    if ".".join(parts[:n]) in types_), ".".join(parts))
        shown = (given or {}).get(key, flat.get(key, e["input"]))
        raise type_error(key, shown, types_.get(key)) from None


@functools.cache
def _dataclass_root(cls: type) -> type[pydantic.BaseModel]:
    return pydantic.create_model(f"Root_{cls.__name__}", __config__=_PYDANTIC,
                                 config=(cls, ...))


def load_dataclass(cls: type, path: str | None = None, overrides: list[str] | None = None, *,
                   defaults: dict[str, Any] | None = None, values: dict[str, Any] | None = None):
    """A config of any frozen dataclass ``cls`` (a family trainer's) read the way
    :func:`load_config` reads a run's: ``defaults`` (dotted keys), then the YAML file ``path``
    (optional; ``base:`` chains too), then ``values`` (dotted keys, Python values), then the
    ``key=value`` texts of ``overrides`` — keys checked, types checked through pydantic,
    every number finite and in range. Rules beyond types are the caller's."""
    types_ = leaf_types(cls)
    flat = dict(defaults or {})
    flat.update(flatten_keys(load_yaml(path)) if path else {})
    flat.update(values or {})
    pairs = split_overrides(overrides)
    for key in flat:
        check_key(key, types_)
    flat = _apply(flat, pairs, types_)
    cfg = _validate(_dataclass_root(cls), {"config": nest_keys(flat)}, flat, types_,
                    dict(pairs)).config
    check_numbers(cfg, given=dict(pairs))
    return cfg


def load_config(name_or_path: str | None = None, overrides: list[str] | None = None, *,
                family: str | None = None, model: dict | None = None,
                origin: str | None = None) -> Config:
    """Load a preset name or YAML path, apply ``key=value`` overrides, return a frozen Config.

    ``family``: the model family the config is read for, when a model folder decided it first
    (``ditax generate --model FOLDER``): the ``model.*`` keys are that family's (another
    family's key is refused naming it) and a ``model.family`` that names another is refused.
    ``model``: the folder's own model fields (:meth:`ditax.models.base.ModelFamily.
    folder_config`), the values under the YAML's and the overrides', so the rules check the
    folder's heads and shapes. ``origin``: why the family is fixed, for those messages."""
    fixed = _fixed(family, origin)
    flat = flatten_keys(load_yaml(name_or_path)) if name_or_path else {}
    pairs = split_overrides(overrides)
    kind = _family(flat, pairs, fixed)       # a contradicting model.family: refused here
    # a model folder's run (generate / serve / calibrate-cache on FOLDER): attention "auto",
    # the platform's kernel (TPU: splash; CUDA: cudnn; CPU: xla), where the dataclass default
    # xla would hold a 480p video's 32k x 32k scores (51 GB) on a TPU; a YAML or override wins
    folder = {"attention.backend": "auto"} if model is not None and not name_or_path else {}
    flat = {**folder, **_folder_flat(family, model), **flat}
    kind = _family(flat, pairs, fixed) if model else kind
    for key in flat if fixed is not None else ():   # else from_flat checks them, as always
        _check_key(key, key_types(kind.config), fixed)
    flat = _apply(flat, pairs, key_types(kind.config), fixed)
    # a sample preset fills its fields over the YAML's; the overrides given keep theirs
    flat = expand_preset(flat, {k for k, _ in pairs})
    return from_flat(flat, kind, dict(pairs))


def to_dict(cfg) -> dict:
    """A config as plain nested dicts and lists (YAML / JSON ready)."""

    def fix(x):
        if isinstance(x, dict):
            return {k: fix(v) for k, v in x.items()}
        return list(x) if isinstance(x, tuple) else x

    return fix(dataclasses.asdict(cfg))


def replace(cfg, **changes):
    """``dataclasses.replace`` that also accepts dotted keys: replace(cfg, **{"mesh.fsdp": 8})."""
    nested: dict = {}
    flat = {}
    for k, v in changes.items():
        if "." in k:
            head, rest = k.split(".", 1)
            nested.setdefault(head, {})[rest] = v
        else:
            flat[k] = v
    for head, sub in nested.items():
        flat[head] = replace(getattr(cfg, head), **sub)
    return dataclasses.replace(cfg, **flat)


__all__ = ["PRESET_DIR", "preset_names", "load_yaml", "flatten_keys", "nest_keys",
           "split_overrides", "parse_overrides", "from_flat", "load_config", "load_dataclass",
           "to_dict", "replace"]
