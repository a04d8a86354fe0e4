"""A family's config variants (``FamilySpec.variants``): a ``model:`` section that names a
variant's own field is read into that variant (Wan: a Wan 2.2 Animate field makes the section a
``WanAnimateConfig``), a plain section stays the family's class, and fields of two variants
together are refused in one line."""

from dataclasses import dataclass
from typing import Literal

import pytest

from ditax.config import load_config
from ditax.config.families import config_family
from ditax.errors import ConfigError
from ditax.models import registry
from ditax.models.wan.animate import WanAnimateConfig
from ditax.models.wan.config import WanConfig


@dataclass(frozen=True)
class Base:
    family: Literal["variants_toy"] = "variants_toy"
    num_attention_heads: int = 2


@dataclass(frozen=True)
class One(Base):
    one: int = 1


@dataclass(frozen=True)
class Two(Base):
    two: int = 2


def test_wan_sections_pick_the_animate_variant():
    assert type(load_config("tiny").model) is WanConfig
    cfg = load_config("tiny", ["model.motion_encoder_size=16", "model.in_channels=36"])
    assert type(cfg.model) is WanAnimateConfig and cfg.model.motion_encoder_size == 16
    assert type(load_config("wan2.2-animate-14b").model) is WanAnimateConfig


def test_fields_of_two_variants_are_refused(monkeypatch):
    spec = registry.FamilySpec("variants_toy", config=Base, variants=(One, Two))
    monkeypatch.setitem(registry._SPECS, "variants_toy", spec)
    assert config_family("variants_toy", {"num_attention_heads"}).config is Base
    assert config_family("variants_toy", {"one"}).config is One
    with pytest.raises(ConfigError, match=r"model.one \(One\) and model.two \(Two\) belong to "
                                          r"different variants_toy variants"):
        config_family("variants_toy", {"one", "two"})


def test_class_constants_are_no_config_keys():
    """A family config's class constants (FLUX's ``CLASS_NAME``, ``DIFFUSERS_FIELDS``) are
    neither settable nor listed among a family's model keys."""
    from ditax.config.keys import key_types
    from ditax.models.flux.config import FluxConfig

    keys = key_types(FluxConfig)
    assert "model.num_layers" in keys
    assert not [k for k in keys if k.split(".")[-1].isupper()], keys
    with pytest.raises(ConfigError, match="unknown config key 'model.CLASS_NAME'"):
        load_config("flux-tiny", ["model.CLASS_NAME=x"])
