"""Model families: which config class a ``model:`` section is read into, and its rules.

``model.family`` (default ``wan``) picks the entry. A family's config is a frozen dataclass with
a ``family: Literal["<name>"]`` field and ``num_attention_heads`` (used by the attention rules);
its rules are checked by its runtime interface (:class:`ditax.models.base.ConfigFamily.check`),
which :func:`ditax.config.validate` calls; this registry only says how to read the YAML.

A second family plugs in without editing this package: its ``ditax/models/<name>/config.py``
calls :func:`register_config_family` at import, and :func:`config_family` imports that module the
first time a config names the family.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import get_args, get_type_hints

from ditax.errors import ConfigError, check_choice
from ditax.models.wan.config import ModelConfig as WanModelConfig


@dataclass(frozen=True)
class ConfigFamily:
    """A registered family: the config class its ``model:`` section is read into."""

    name: str
    config: type


_FAMILIES: dict[str, ConfigFamily] = {}


def register_config_family(config_cls: type) -> None:
    """Register ``config_cls`` under the name its ``family`` field defaults to."""
    if not dataclasses.is_dataclass(config_cls):
        raise TypeError(f"{config_cls!r} is not a dataclass")
    names = get_args(get_type_hints(config_cls).get("family"))
    if len(names) != 1:
        raise TypeError(f"{config_cls.__name__} needs a field family: Literal['<name>']")
    _FAMILIES[names[0]] = ConfigFamily(names[0], config_cls)


def config_family(name: str) -> ConfigFamily:
    """The family called ``name``; imports ``ditax.models.<name>.config`` on first use."""
    if name not in _FAMILIES and isinstance(name, str) and name.isidentifier():
        try:
            importlib.import_module(f"ditax.models.{name}.config")
        except ModuleNotFoundError as e:   # only "no such family"; a broken module raises
            if not f"ditax.models.{name}.config".startswith(e.name or "\0"):
                raise
    if name not in _FAMILIES:
        check_choice("model.family", name, sorted(_FAMILIES))
        raise ConfigError(f"model.family={name!r}: its config module did not register it")
    return _FAMILIES[name]


def family_names() -> list[str]:
    return sorted(_FAMILIES)


register_config_family(WanModelConfig)

__all__ = ["ConfigFamily", "register_config_family", "config_family", "family_names"]
