"""Configuration: frozen dataclasses, YAML presets, ``key=value`` overrides, validation.

Config is data (DESIGN rule 1): one frozen dataclass per concern, composed into
:class:`Config`. ``load_config("tiny", ["mesh.fsdp=8", "attention.backend=ulysses"])`` reads a
preset (``presets/*.yaml``) or a YAML path, applies dotted overrides, type-checks everything
(pydantic over the dataclass annotations; enum-like fields are ``Literal``) and returns a
frozen object. :func:`validate` runs the rules each section's owner holds and raises
:class:`ConfigError` with the value and the fix.

Layout: ``schema.py`` (:class:`Config`, :func:`validate`), ``training.py`` / ``sample.py`` (the
sections owned here), ``families.py`` (the model section's class, from the one family
registry :mod:`ditax.models.registry`), ``keys.py`` (dotted keys and their messages),
``loader.py`` (YAML, overrides, building).

``ModelConfig`` is the config class of the default family (Wan's), looked up in the registry on
first access: this package names no family.
"""

from ditax.attention.config import AttentionConfig
from ditax.config.families import (ConfigFamily, config_family, default_config_class,
                                   register_config_family)
from ditax.config.loader import (
    PRESET_DIR,
    from_flat,
    load_config,
    load_yaml,
    parse_overrides,
    preset_names,
    replace,
    to_dict,
)
from ditax.config.sample import SampleConfig
from ditax.config.schema import Config, validate
from ditax.config.training import (CheckpointConfig, DataConfig, DistillConfig, FlowConfig,
                                   OptimConfig)
from ditax.errors import ConfigError
from ditax.parallel.mesh import MeshConfig

__all__ = [
    "Config", "ConfigError", "validate", "load_config", "load_yaml", "parse_overrides",
    "from_flat", "preset_names", "PRESET_DIR", "replace", "to_dict", "ModelConfig",
    "MeshConfig", "AttentionConfig", "OptimConfig", "FlowConfig", "DataConfig",
    "CheckpointConfig", "DistillConfig", "SampleConfig", "ConfigFamily", "config_family", "register_config_family",
]


def __getattr__(name: str):
    if name == "ModelConfig":   # the default family's config class (Wan's), from the registry
        return default_config_class()
    raise AttributeError(f"module 'ditax.config' has no attribute {name!r}")
