"""The one family registry (:mod:`ditax.models.registry`): its discovery rule (a subpackage of
``ditax.models`` that registers itself; outside ditax a dotted module path), folder class names,
and the config loader and runtime interface both reading it."""

import dataclasses
import subprocess
import sys
import textwrap
from typing import Literal

import pytest

from ditax.errors import ConfigError, ModelNotFound
from ditax.models import registry


def test_wan_is_found_by_its_subpackage_and_its_folder_classes():
    spec = registry.spec("wan")
    assert spec.family_class().__name__ == "WanFamily"
    assert spec.config_class().__name__ in ("WanConfig", "ModelConfig")
    for cls in ("WanTransformer3DModel", "WanPipeline", "WanImageToVideoPipeline"):
        assert registry.spec_for_class(cls).name == "wan"
    assert "wan" in registry.family_names()


def test_unknown_names_list_what_is_known():
    with pytest.raises(ConfigError, match=r"model.family='nope' is not a known model family; "
                                          r"use one of .*wan"):
        registry.spec("nope")
    with pytest.raises(ModelNotFound, match=r"_class_name='StableDiffusion3Pipeline' is not a "
                                            r"model ditax can load; known: .*FluxPipeline.*"
                                            r"WanPipeline"):
        registry.spec_for_class("StableDiffusion3Pipeline")
    assert registry.spec_for_class("FluxPipeline").name == "flux"


def test_registry_imports_no_jax():
    code = ("import sys; from ditax.models import registry; registry.spec('wan'); "
            "assert 'jax' not in sys.modules and 'flax' not in sys.modules")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_a_family_outside_ditax_is_its_dotted_module_path(tmp_path, monkeypatch):
    pkg = tmp_path / "toy_outside"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "family.py").write_text(textwrap.dedent('''
        import dataclasses
        from typing import Literal

        from ditax.models.registry import FamilySpec, register


        @dataclasses.dataclass(frozen=True)
        class OutsideConfig:
            family: Literal["toy_outside.family"] = "toy_outside.family"
            num_attention_heads: int = 2
            width: int = 8


        register(FamilySpec("toy_outside.family", config=OutsideConfig,
                            pipeline_classes=("ToyOutsidePipeline",)))
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_SPECS", dict(registry._SPECS))
    from ditax.config import load_config

    cfg = load_config(None, ["model.family=toy_outside.family", "model.width=4"])
    assert type(cfg.model).__name__ == "OutsideConfig" and cfg.model.width == 4
    assert registry.spec_for_class("ToyOutsidePipeline").name == "toy_outside.family"


def test_register_family_and_config_fill_one_spec(monkeypatch):
    from ditax.config.families import config_family, register_config_family
    from ditax.models.base import family_class, register_family

    registry.spec("wan")
    monkeypatch.setattr(registry, "_SPECS", dict(registry._SPECS))

    @dataclasses.dataclass(frozen=True)
    class Cfg:
        family: Literal["both"] = "both"

    class Fam:
        name = "both"

    register_config_family(Cfg)
    register_family(Fam)
    assert registry.spec("both").config is Cfg and registry.spec("both").family is Fam
    assert config_family("both").config is Cfg and family_class("both") is Fam
