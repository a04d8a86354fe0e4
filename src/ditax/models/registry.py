"""The one registry of model families, its one discovery rule, and the capability vocabulary.

A family is ONE declaration, a :class:`FamilySpec` that names all of its parts: its name
(what a config's ``model.family`` says), its config class (the dataclass a ``model:`` section
is read into) and config ``variants``, its runtime interface (a
:class:`ditax.models.base.ModelFamily` subclass), its pipelines (a
:class:`ditax.pipelines.family.PipelineFamily` subclass), its own trainers (kind →
:class:`ditax.models.base.FamilyTrainer`), its LoRA names (a :class:`ditax.lora.LoraNames`),
the diffusers ``_class_name`` s of the transformer folders (``config.json``) and pipeline
folders (``model_index.json``) it reads, and its ``capabilities``. Every part is a
``"module:Name"`` string (imported on first use, so registering stays cheap and JAX-free) or
the object itself (a test registers a toy family it defines).

Capabilities — what a family MAY have beyond what every family must supply — come from one
vocabulary, :data:`CAPABILITIES`. A family declares the ones it has; a command or API that
needs one asks :func:`require` before any work, which answers an undeclared capability in one
line naming the family, the capability and what to do. Nothing is discovered by calling a
method and catching its error, nor by ``getattr``.

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
class Capability:
    """One entry of the vocabulary: ``noun`` completes "model family X has no ...", ``needs``
    says what uses it, ``methods`` the :class:`~ditax.models.base.ModelFamily` methods a family
    that declares it overrides (``part``: the :class:`FamilySpec` field it must fill)."""

    noun: str
    needs: str
    methods: tuple[str, ...] = ()
    part: str | None = None


# The one vocabulary of optional capabilities (what the commands and APIs branch on). Every
# family supplies the abstract ModelFamily methods (so ditax plan and ditax train run for all);
# these are the rest.
CAPABILITIES: dict[str, Capability] = {
    "transformer": Capability(
        "transformer loader", "ditax.load_transformer, ditax convert --quantize",
        ("load_transformer",)),
    "single_file": Capability(
        "single-file checkpoint reader",
        "ditax convert FILE, ditax.load_transformer(FILE, config=)",
        ("check_single_file", "convert_single_file")),
    "folder_check": Capability(
        "transformer folder check", "ditax convert FOLDER and the check of what it writes",
        ("check_folder",)),
    "quantize": Capability(
        "8-bit loading", "model.quantize=int8|fp8, quantize=, ditax convert --quantize"),
    "lora": Capability(
        "LoRA support", "--lora, loras=, lora.rank and ditax convert --lora",
        ("lora_table",), part="lora_names"),
    "step_cache": Capability(
        "step cache", "ditax calibrate-cache and the pipelines' cache=, cfg_cache=",
        part="pipelines"),
    "bench": Capability(
        "random transformer for bench", "ditax bench",
        ("random_transformer", "random_inputs")),
    "preprocess": Capability(
        "encoders for preprocessing", "ditax preprocess", ("load_encoders",)),
    "init_from": Capability(
        "weights loader for training", "ditax train init_from=",
        ("weights_folder", "load_params")),
    "train_vae": Capability(
        "VAE trainer", "ditax train-vae", part="trainers"),
    "causal": Capability(
        "causal transformer with a KV cache", "distill.method=self_forcing", ("kv_cache",)),
}

# model-section fields that only a family with the capability has (refused, naming the
# capability, when a config of a family without it names them)
CAPABILITY_FIELDS: dict[str, str] = {"quantize": "quantize",
                                     "quantize_activations": "quantize"}


class MissingCapability(ConfigError):
    """A command or API needs a capability the family does not declare (exit 2)."""


@dataclass(frozen=True)
class FamilySpec:
    """One model family, all of its parts. Each part is a ``"module:Name"`` string or the
    object: ``config`` (model config dataclass), ``family`` (``ModelFamily`` subclass),
    ``pipelines`` (``PipelineFamily`` subclass; None: loads no pipeline folders), ``trainers``
    (kind → ``FamilyTrainer`` subclass, e.g. ``{"vae": ...}``), ``lora_names`` (a ``LoraNames``
    object; None: reads no LoRA files); ``transformer_classes`` / ``pipeline_classes`` the
    diffusers ``_class_name`` s of the folders it reads; ``variants`` config subclasses;
    ``capabilities`` names from :data:`CAPABILITIES`; ``random_folders`` the family's
    :class:`ditax.recipes.random_folders.RandomFolders` (``ditax init-random``: its small
    presets and the random-weight pipeline folder of a model config; None: it has none)."""

    name: str
    config: Any = None
    family: Any = None
    transformer_classes: tuple[str, ...] = ()
    pipeline_classes: tuple[str, ...] = ()
    variants: tuple = ()     # subclasses of ``config`` a model: section may be read into
    pipelines: Any = None
    trainers: Any = dataclasses.field(default_factory=dict)
    lora_names: Any = None
    capabilities: frozenset = frozenset()
    random_folders: Any = None

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

    def pipelines_class(self) -> type | None:
        """The :class:`~ditax.pipelines.family.PipelineFamily` subclass (None: none)."""
        return None if self.pipelines is None else resolve(self.pipelines)

    def trainer_class(self, kind: str) -> type | None:
        """The family's trainer of ``kind`` (None: none)."""
        ref = self.trainers.get(kind)
        return None if ref is None else resolve(ref)

    def lora_names_object(self):
        """The family's :class:`~ditax.lora.LoraNames` (None: it reads no LoRA files)."""
        return None if self.lora_names is None else resolve(self.lora_names)

    def random_folders_object(self):
        """The family's random-folder hook (``ditax init-random``; None: it has none)."""
        return None if self.random_folders is None else resolve(self.random_folders)

    def has(self, capability: str) -> bool:
        """Whether the family declares ``capability`` (a name of :data:`CAPABILITIES`)."""
        if capability not in CAPABILITIES:
            raise KeyError(f"{capability!r} is no capability; the vocabulary: "
                           f"{', '.join(CAPABILITIES)}")
        return capability in self.capabilities

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
    Returns ``spec``; :class:`TypeError` for a capability outside the vocabulary or one whose
    part (``lora_names``, ``pipelines``, ``trainers['vae']``) the spec does not name."""
    if not isinstance(spec, FamilySpec):
        raise TypeError(f"register() takes a FamilySpec, got {type(spec).__name__}")
    if not isinstance(spec.name, str) or not spec.name:
        raise TypeError(f"FamilySpec.name must be a non-empty string, got {spec.name!r}")
    caps = frozenset(spec.capabilities)
    unknown = sorted(caps - set(CAPABILITIES))
    if unknown:
        raise TypeError(f"family {spec.name!r}: capabilities {unknown} are not in the "
                        f"vocabulary ({', '.join(CAPABILITIES)})")
    trainers = dict(spec.trainers or {})
    for cap in sorted(caps):
        part = CAPABILITIES[cap].part
        filled = ("vae" in trainers) if part == "trainers" else (
            part is None or getattr(spec, part) is not None)
        if not filled:
            raise TypeError(f"family {spec.name!r} declares capability {cap!r} but names no "
                            f"{part}{'[vae]' if part == 'trainers' else ''}")
    _SPECS[spec.name] = dataclasses.replace(
        spec, transformer_classes=tuple(spec.transformer_classes),
        pipeline_classes=tuple(spec.pipeline_classes), variants=tuple(spec.variants),
        trainers=trainers, capabilities=caps)
    return _SPECS[spec.name]


def update(name: str, **parts) -> FamilySpec:
    """Fill ``parts`` of family ``name``'s spec (a new spec with only them when ``name`` is not
    registered yet): what the thin registration wrappers (``register_family``,
    ``register_config_family``, ``register_pipelines``) do."""
    current = lookup(name) or FamilySpec(name)
    return register(dataclasses.replace(current, **parts))


def require(name: str, capability: str, what: str, fix: str | None = None) -> FamilySpec:
    """Family ``name``'s spec when it declares ``capability``; else one
    :class:`MissingCapability` line: ``"<what>: model family 'x' has no <noun> (capability
    '<capability>' not declared); <fix>"`` — asked by a command or API before any work."""
    found = spec(name)
    if not found.has(capability):
        c = CAPABILITIES[capability]
        if fix is None:
            have = [n for n in family_names() if _SPECS[n].has(capability)]
            fix = f"use a model of a family that has it ({', '.join(have) or 'none'})"
        raise MissingCapability(f"{what}: model family {name!r} has no {c.noun} (capability "
                                f"{capability!r}, used by {c.needs}, is not declared); {fix}")
    return found


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


# the shared rooms of models/ (the building floor, the encoders, the VAEs): subpackages that
# register no family, so discovery does not import them
SHARED_ROOMS = ("common", "encoders", "vae")


def _discover() -> None:
    """Import every subpackage of :mod:`ditax.models` but the :data:`SHARED_ROOMS` once (the
    built-in families register on import)."""
    global _discovered
    if _discovered:
        return
    import ditax.models

    for info in pkgutil.iter_modules(ditax.models.__path__):
        if info.ispkg and info.name not in SHARED_ROOMS:
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


__all__ = ["FamilySpec", "Capability", "CAPABILITIES", "CAPABILITY_FIELDS", "MissingCapability",
           "register", "update", "require", "lookup", "resolve", "spec", "spec_for_class",
           "family_names", "import_if_present", "plugin_modules", "DEFAULT_FAMILY"]
