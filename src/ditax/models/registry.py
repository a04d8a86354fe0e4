"""The one registry of model families, and its one discovery rule.

A family is described by a :class:`FamilySpec`: its name (what a config's ``model.family``
says), its config class (the dataclass a ``model:`` section is read into), its runtime
interface (a :class:`ditax.models.base.ModelFamily` subclass), and the diffusers
``_class_name`` s of the transformer folders (``config.json``) and pipeline folders
(``model_index.json``) it reads, and the config subclasses a ``model:`` section may be read
into (``variants``: chosen by the fields the section names). Config class and interface are
given as ``"module:Name"`` strings (imported on first use, so registering stays cheap) or as
the objects themselves (a test registers a toy family it defines).

Discovery — one rule:

- a **built-in** family is a subpackage of :mod:`ditax.models` whose package ``__init__``
  registers a spec under the subpackage's name (``ditax/models/wan/__init__.py`` registers
  ``wan``); ``spec("wan")`` imports ``ditax.models.wan`` the first time it is asked for;
- a family **outside ditax** is named by the dotted path of a module that registers a spec
  under that same dotted name when imported (``model.family=my_pkg.toy`` imports ``my_pkg.toy``,
  which calls ``register(FamilySpec("my_pkg.toy", ...))``), so a run config names its family
  fully and a fresh process finds it again;
- :func:`register` also takes a spec directly (a family defined in a test or a notebook);
- families outside ditax that a FOLDER names (its ``_class_name``) are found when their module
  is imported at discovery: the modules named by the environment variable ``DITAX_FAMILIES``
  (comma-separated dotted paths) and those of the ``ditax.families`` entry-point group of the
  installed packages (a plug-in package declares ``[project.entry-points."ditax.families"]
  my_family = "my_pkg.family"``).

This module imports nothing heavy (no JAX, no flax): the ``ditax`` command and config loading
use it before any platform is chosen.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import pkgutil
from dataclasses import dataclass
from typing import Any

from ditax.errors import ConfigError, ModelNotFound

DEFAULT_FAMILY = "wan"   # the family of a config that names none


@dataclass(frozen=True)
class FamilySpec:
    """One model family: ``config`` and ``family`` are ``"module:Name"`` strings or the
    classes; ``transformer_classes`` / ``pipeline_classes`` the diffusers ``_class_name`` s of
    the folders it reads (empty for a family that loads no folders)."""

    name: str
    config: Any = None
    family: Any = None
    transformer_classes: tuple[str, ...] = ()
    pipeline_classes: tuple[str, ...] = ()
    variants: tuple = ()     # subclasses of ``config`` a model: section may be read into

    def config_class(self) -> type:
        """The config dataclass (imported on first use)."""
        if self.config is None:
            raise ConfigError(f"model family {self.name!r} declares no config class, so a "
                              f"model: section cannot be read for it")
        return resolve(self.config)

    def variant_classes(self) -> tuple[type, ...]:
        """The config subclasses (``variants``, imported on first use): a ``model:`` section
        that names a field only a variant has is read into that variant (Wan: VACE, Animate)."""
        return tuple(resolve(v) for v in self.variants)

    def family_class(self) -> type:
        """The :class:`~ditax.models.base.ModelFamily` subclass (imported on first use)."""
        if self.family is None:
            raise ConfigError(f"model family {self.name!r} declares no runtime interface "
                              f"(FamilySpec.family)")
        return resolve(self.family)

    @property
    def class_names(self) -> tuple[str, ...]:
        return tuple(self.transformer_classes) + tuple(self.pipeline_classes)


_SPECS: dict[str, FamilySpec] = {}
_discovered = False


def resolve(ref):
    """The object a ``"module:Name"`` string names (imported); any other value as it is."""
    if not isinstance(ref, str):
        return ref
    module, sep, attr = ref.partition(":")
    if not sep or not module or not attr:
        raise ConfigError(f"{ref!r} is not a 'module:Name' reference")
    return getattr(importlib.import_module(module), attr)


def register(spec: FamilySpec) -> FamilySpec:
    """Make ``spec`` the family called ``spec.name`` (a second call with the name replaces it).
    Returns ``spec``."""
    if not isinstance(spec, FamilySpec):
        raise TypeError(f"register() takes a FamilySpec, got {type(spec).__name__}")
    if not isinstance(spec.name, str) or not spec.name:
        raise TypeError(f"FamilySpec.name must be a non-empty string, got {spec.name!r}")
    _SPECS[spec.name] = dataclasses.replace(
        spec, transformer_classes=tuple(spec.transformer_classes),
        pipeline_classes=tuple(spec.pipeline_classes), variants=tuple(spec.variants))
    return _SPECS[spec.name]


def _module_of(name: str) -> str:
    """The module that registers family ``name``: ``ditax.models.<name>`` for a plain name,
    the dotted path itself otherwise."""
    return name if "." in name else f"ditax.models.{name}"


def import_if_present(module: str) -> bool:
    """Import ``module``; False when it does not exist (a module it imports that is missing is
    a broken install and raises)."""
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name and (module == e.name or module.startswith(e.name + ".")):
            return False
        raise
    return True


def _discover() -> None:
    """Import every subpackage of :mod:`ditax.models` once (the built-in families register on
    import)."""
    global _discovered
    if _discovered:
        return
    import ditax.models

    for info in pkgutil.iter_modules(ditax.models.__path__):
        if info.ispkg:
            importlib.import_module(f"ditax.models.{info.name}")
    for module in plugin_modules():
        if not import_if_present(module):
            raise ConfigError(f"DITAX_FAMILIES names {module!r}, which is not an importable "
                              f"module; fix the dotted path or remove it from DITAX_FAMILIES")
    _discovered = True


def plugin_modules() -> list[str]:
    """The modules of families outside ditax that discovery imports: ``$DITAX_FAMILIES``
    (comma-separated dotted paths), then the ``ditax.families`` entry points' modules."""
    from importlib.metadata import entry_points

    names = [m.strip() for m in os.environ.get("DITAX_FAMILIES", "").split(",") if m.strip()]
    names += [ep.value.partition(":")[0] for ep in entry_points(group="ditax.families")]
    return list(dict.fromkeys(names))


def lookup(name: str) -> FamilySpec | None:
    """The family called ``name`` (its module imported on first use, by the discovery rule),
    or None."""
    if isinstance(name, str) and name not in _SPECS and all(
            p.isidentifier() for p in name.split(".")):
        import_if_present(_module_of(name))
    return _SPECS.get(name) if isinstance(name, str) else None


def spec(name: str) -> FamilySpec:
    """The family called ``name`` (its module imported on first use);
    :class:`ConfigError` listing the known names when there is none."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"model.family={name!r} must be a family name, e.g. "
                          f"{DEFAULT_FAMILY!r}")
    if lookup(name) is None:
        raise ConfigError(f"model.family={name!r} is not a known model family; use one of "
                          f"{', '.join(family_names())} (or the dotted path of a module that "
                          f"registers it)")
    return _SPECS[name]


def spec_for_class(class_name: str) -> FamilySpec:
    """The family whose transformer or pipeline ``_class_name`` s hold ``class_name`` (a
    folder's ``config.json`` / ``model_index.json``); :class:`ModelNotFound` listing the known
    class names when none does."""
    for pass_ in range(2):
        for s in _SPECS.values():
            if class_name in s.class_names:
                return s
        if pass_ == 0:
            _discover()
    known = sorted({c for s in _SPECS.values() for c in s.class_names})
    raise ModelNotFound(f"_class_name={class_name!r} is not a model ditax can load; known: "
                        f"{', '.join(known) or 'none'}")


def family_names() -> list[str]:
    """Names of every family: the built-in ones and those registered so far."""
    _discover()
    return sorted(_SPECS)


__all__ = ["FamilySpec", "register", "lookup", "resolve", "spec", "spec_for_class", "family_names",
           "import_if_present", "plugin_modules", "DEFAULT_FAMILY"]
