"""Model families: which config class a ``model:`` section is read into, and its rules.

``model.family`` (default ``wan``) picks the entry. A family's config is a frozen dataclass with
a ``family: Literal["<name>"]`` field and ``num_attention_heads`` (used by the attention rules);
its check function takes ``(model_config, mesh_sizes)`` (mesh sizes None = not yet known).

A second family plugs in without editing this package: its ``ditax/models/<name>/config.py``
calls :func:`register_model_family` at import, and :func:`model_family` imports that module the
first time a config names the family.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import Any, Callable, get_args, get_type_hints

from ditax.errors import ConfigError, check_choice
from ditax.models.wan.config import ModelConfig as WanModelConfig
from ditax.models.wan.config import check_model as check_wan_model


@dataclass(frozen=True)
class ModelFamily:
    """A registered family: its config class and the function that checks one."""

    name: str
    config: type
    check: Callable[[Any, dict | None], None]


_FAMILIES: dict[str, ModelFamily] = {}


def register_model_family(config_cls: type, check: Callable[[Any, dict | None], None]) -> None:
    """Register ``config_cls`` under the name its ``family`` field defaults to."""
    if not dataclasses.is_dataclass(config_cls):
        raise TypeError(f"{config_cls!r} is not a dataclass")
    names = get_args(get_type_hints(config_cls).get("family"))
    if len(names) != 1:
        raise TypeError(f"{config_cls.__name__} needs a field family: Literal['<name>']")
    _FAMILIES[names[0]] = ModelFamily(names[0], config_cls, check)


def model_family(name: str) -> ModelFamily:
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


register_model_family(WanModelConfig, check_wan_model)

__all__ = ["ModelFamily", "register_model_family", "model_family", "family_names"]
