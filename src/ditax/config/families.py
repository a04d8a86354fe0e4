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


def config_family(name: str) -> ConfigFamily:
    """The family called ``name`` with its config class (imported on first use)."""
    found = registry.lookup(name)
    if found is None or found.config is None:
        check_choice("model.family", name, family_names())
        raise ConfigError(f"model.family={name!r}: its module did not register it")
    return ConfigFamily(found.name, found.config_class())


def family_names() -> list[str]:
    """The families a ``model:`` section can name (those that declare a config class)."""
    return [n for n in registry.family_names() if registry.spec(n).config is not None]


def default_config_class() -> type:
    """The config class of the default family (what a config that names no family gets)."""
    return registry.spec(registry.DEFAULT_FAMILY).config_class()


__all__ = ["ConfigFamily", "register_config_family", "config_family", "family_names",
           "default_config_class"]
