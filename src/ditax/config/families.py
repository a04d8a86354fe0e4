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
    """Make ``config_cls`` the config class of the family its ``family`` field names (a
    ``Literal`` of one name), in :mod:`ditax.models.registry`."""
    if not dataclasses.is_dataclass(config_cls):
        raise TypeError(f"{config_cls!r} is not a dataclass")
    names = get_args(get_type_hints(config_cls).get("family"))
    if len(names) != 1:
        raise TypeError(f"{config_cls.__name__} needs a field family: Literal['<name>']")
    current = registry.lookup(names[0]) or registry.FamilySpec(names[0])
    registry.register(dataclasses.replace(current, config=config_cls))


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


def family_names() -> list[str]:
    """The families a ``model:`` section can name (those that declare a config class)."""
    return [n for n in registry.family_names() if registry.spec(n).config is not None]


def default_config_class() -> type:
    """The config class of the default family (what a config that names no family gets)."""
    return registry.spec(registry.DEFAULT_FAMILY).config_class()


__all__ = ["ConfigFamily", "register_config_family", "config_family", "family_names",
           "default_config_class"]
