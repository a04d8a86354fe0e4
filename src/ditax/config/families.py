"""Model families as the config loader sees them: which class a ``model:`` section is read into.

``model.family`` (default ``wan``) names the family in the one registry,
:mod:`ditax.models.registry` (its discovery rule: a built-in family is a subpackage of
``ditax.models`` that registers itself; a family outside ditax is the dotted path of a module
that does). A family's config is a frozen dataclass with a ``family: Literal["<name>"]`` field
and ``num_attention_heads`` (used by the attention rules); its rules are checked by its runtime
interface (:meth:`ditax.models.base.ModelFamily.check`), which :func:`ditax.config.validate`
calls; here is only how to read the YAML.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import get_args, get_type_hints

from ditax.errors import ConfigError, check_choice
from ditax.models import registry


@dataclass(frozen=True)
class ConfigFamily:
    """A registered family: the config class its ``model:`` section is read into."""

    name: str
    config: type


def register_config_family(config_cls: type) -> None:
    """Thin wrapper kept for tests and families outside ditax: fill the ``config`` part of the
    one declaration (:func:`ditax.models.registry.update`) of the family that ``config_cls``'s
    ``family`` field names (a ``Literal`` of one name). A family's own
    ``FamilySpec(config=...)`` is the usual way."""
    if not dataclasses.is_dataclass(config_cls):
        raise TypeError(f"{config_cls!r} is not a dataclass")
    names = get_args(get_type_hints(config_cls).get("family"))
    if len(names) != 1:
        raise TypeError(f"{config_cls.__name__} needs a field family: Literal['<name>']")
    registry.update(names[0], config=config_cls)


def config_family(name: str, keys=()) -> ConfigFamily:
    """The family called ``name`` with its config class (imported on first use): the family's
    own, or the variant (:meth:`~ditax.models.registry.FamilySpec.variant_classes`, Wan 2.2
    Animate's) whose own fields ``keys`` (the ``model:`` section's field names) name."""
    found = registry.lookup(name)
    if found is None or found.config is None:
        check_choice("model.family", name, family_names())
        raise ConfigError(f"model.family={name!r}: its module did not register it")
    base = found.config_class()
    extra = set(keys) - {f.name for f in dataclasses.fields(base)}
    for key in sorted(extra & set(registry.CAPABILITY_FIELDS)):    # before "unknown key"
        registry.require(name, registry.CAPABILITY_FIELDS[key], f"model.{key}",
                         f"remove model.{key}")
    if not extra:       # the family's own fields only: its variants are not even imported
        return ConfigFamily(found.name, base)
    hits = [(v, sorted(extra & {f.name for f in dataclasses.fields(v)}))
            for v in found.variant_classes()]
    hits = [(v, k) for v, k in hits if k]
    if len(hits) > 1:
        raise ConfigError(f"model.{hits[0][1][0]} ({hits[0][0].__name__}) and model."
                          f"{hits[1][1][0]} ({hits[1][0].__name__}) belong to different "
                          f"{name} variants; keep the fields of one")
    return ConfigFamily(found.name, hits[0][0] if hits else base)


def check_capabilities(cfg, command: str, training: bool = False) -> None:
    """The capabilities run config ``cfg`` asks of its model family, each refused in one line
    (:func:`ditax.models.registry.require`) before any work: 8-bit weights
    (``model.quantize``), and for a training run LoRA (``lora.rank`` > 0) and a weights
    loader (``init_from``). ``command``: what the messages name (``"ditax train"``)."""
    name = getattr(cfg.model, "family", registry.DEFAULT_FAMILY)
    if getattr(cfg.model, "quantize", "none") not in ("none", None):
        registry.require(name, "quantize", f"{command}: model.quantize={cfg.model.quantize}",
                         "remove model.quantize")
    if training and getattr(getattr(cfg, "lora", None), "rank", 0):
        registry.require(name, "lora", f"{command}: lora.rank={cfg.lora.rank}",
                         "use lora.rank=0 (full training)")
    if training and getattr(cfg, "init_from", None):
        registry.require(name, "init_from", f"{command}: init_from={cfg.init_from}",
                         "remove init_from to start from random weights")


def family_names() -> list[str]:
    """The families a ``model:`` section can name (those that declare a config class)."""
    return [n for n in registry.family_names() if registry.spec(n).config is not None]


def default_config_class() -> type:
    """The config class of the default family (what a config that names no family gets)."""
    return registry.spec(registry.DEFAULT_FAMILY).config_class()


__all__ = ["ConfigFamily", "register_config_family", "config_family", "check_capabilities",
           "family_names", "default_config_class"]
