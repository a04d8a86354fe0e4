"""One declaration per family (:class:`ditax.models.registry.FamilySpec`) and declared
capabilities: every built-in family's spec names all of its parts and they import; the
capabilities come from one vocabulary and match the methods the family overrides; a family
that does not declare a capability is refused in one line (exit 2, naming the family and the
capability) by every command and API that needs it, before any work."""

import dataclasses
import importlib
import subprocess
import sys

import numpy as np
import pytest
import yaml
from family_scope import families_restored

from ditax.errors import ConfigError
from ditax.models import registry
from ditax.models.registry import CAPABILITIES, FamilySpec, MissingCapability

BUILT_IN = ("wan", "flux")


def _overrides(cls, method: str) -> bool:
    from ditax.models.base import ModelFamily

    return next(k for k in cls.__mro__ if method in k.__dict__) is not ModelFamily


@pytest.mark.parametrize("name", BUILT_IN)
def test_a_built_in_spec_names_every_part_and_they_import(name):
    from ditax.lora.names import LoraNames
    from ditax.models.base import FamilyTrainer, ModelFamily
    from ditax.pipelines.family import PipelineFamily, pipelines_of

    s = registry.spec(name)
    assert dataclasses.is_dataclass(s.config_class())
    assert all(issubclass(v, s.config_class()) for v in s.variant_classes())
    fam = s.family_class()
    assert issubclass(fam, ModelFamily) and fam.name == name
    assert issubclass(s.pipelines_class(), PipelineFamily) and s.pipelines_class().name == name
    assert type(pipelines_of(name)) is s.pipelines_class()        # read from the spec
    assert issubclass(s.trainer_class("vae"), FamilyTrainer)
    assert fam.trainers() == s.trainers and fam.trainer("vae").__class__ is s.trainer_class("vae")
    assert isinstance(s.lora_names_object(), LoraNames)
    assert fam.lora_names() is s.lora_names_object()
    assert s.transformer_classes and s.pipeline_classes
    assert s.capabilities and s.capabilities <= set(CAPABILITIES)
    for cap, c in CAPABILITIES.items():     # declared <=> the family's methods exist
        for method in c.methods:
            assert _overrides(fam, method) == (cap in s.capabilities), (name, cap, method)


def test_every_family_must_supply_only_the_abstract_methods():
    from ditax.models.base import ModelFamily

    optional = {m for c in CAPABILITIES.values() for m in c.methods}
    assert not optional & ModelFamily.__abstractmethods__
    assert all(hasattr(ModelFamily, m) for m in optional)


def test_wan_and_flux_declare_what_they_have():
    assert registry.spec("wan").has("step_cache") and not registry.spec("flux").has("step_cache")
    for name in BUILT_IN:
        for cap in ("transformer", "single_file", "folder_check", "quantize", "lora", "bench",
                    "preprocess", "init_from", "train_vae"):
            assert registry.spec(name).has(cap), (name, cap)


def test_a_declaration_outside_the_vocabulary_or_without_its_part_is_refused(monkeypatch):
    monkeypatch.setattr(registry, "_SPECS", dict(registry._SPECS))
    with pytest.raises(TypeError, match=r"capabilities \['teleport'\] are not in the "
                                        r"vocabulary"):
        registry.register(FamilySpec("decl_a", capabilities={"teleport"}))
    with pytest.raises(TypeError, match=r"declares capability 'lora' but names no lora_names"):
        registry.register(FamilySpec("decl_b", capabilities={"lora"}))
    with pytest.raises(TypeError, match=r"'train_vae' but names no trainers\[vae\]"):
        registry.register(FamilySpec("decl_c", capabilities={"train_vae"}))
    with pytest.raises(KeyError, match="teleport"):
        registry.spec("wan").has("teleport")


def test_the_wrappers_fill_the_one_spec(monkeypatch):
    from ditax.pipelines.family import PipelineFamily, pipelines_of, register_pipelines

    monkeypatch.setattr(registry, "_SPECS", dict(registry._SPECS))
    registry.register(FamilySpec("decl_w", capabilities={"bench"},
                                 pipeline_classes=("DeclWPipeline",)))

    class Pipes(PipelineFamily):
        name = "decl_w"

    register_pipelines("decl_w", Pipes)
    s = registry.spec("decl_w")
    assert s.pipelines is Pipes and s.capabilities == {"bench"}
    assert s.pipeline_classes == ("DeclWPipeline",) and isinstance(pipelines_of("decl_w"), Pipes)


def test_the_registry_and_require_import_no_jax():
    code = ("import sys; from ditax.models import registry; "
            "caps = [registry.spec(n).capabilities for n in registry.family_names()]; "
            "registry.require('wan', 'step_cache', 'x'); "
            "assert registry.spec('flux').lora_names and registry.spec('wan').pipelines; "
            "assert 'jax' not in sys.modules and 'flax' not in sys.modules, 'jax imported'")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


# -- a family that declares no capability: each command / API refuses it in one line ----------


@pytest.fixture(scope="module")
def toy():
    """The toy third family (tests/refs/toy_third.py): it declares no capability."""
    with families_restored():
        import toy_third

        yield importlib.reload(toy_third)


@pytest.fixture(scope="module")
def folder(toy, tmp_path_factory):
    return toy.write_folder(tmp_path_factory.mktemp("decl") / "pipe")


@pytest.fixture(scope="module")
def config(toy, tmp_path_factory):
    path = tmp_path_factory.mktemp("decl_cfg") / "toy.yaml"
    path.write_text(yaml.safe_dump({"model": dataclasses.asdict(toy.ToyThirdConfig())}))
    return str(path)


def refused(capsys, argv, capability: str) -> str:
    from ditax.cli import main

    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, (argv, rc, err)
    assert "model family 'toythird' has no" in err[0], err
    assert f"capability {capability!r}" in err[0], err
    return err[0]


def test_commands_refuse_an_undeclared_capability(toy, folder, config, tmp_path, capsys):
    assert not registry.spec(toy.FAMILY).capabilities
    single = tmp_path / "toy.safetensors"
    from safetensors.numpy import save_file

    save_file({"w": np.zeros((2, 2), np.float32)}, str(single))
    out = tmp_path / "out"
    cases = [
        (["convert", str(folder)], "folder_check"),
        (["convert", str(single), "--config", config], "single_file"),
        (["convert", str(folder), "--quantize", "int8", "--out", str(out)], "quantize"),
        (["generate", "--model", str(folder), "--prompt", "a fox", "--lora", "style.safetensors",
          "--output", str(tmp_path / "a.mp4"), "--no-progress"], "lora"),
        (["generate", "--model", str(folder), "--prompt", "a fox", "model.quantize=int8",
          "--output", str(tmp_path / "b.mp4"), "--no-progress"], "quantize"),
        (["calibrate-cache", "--model", str(folder), "--prompts", "a fox", "a cat", "--output",
          str(tmp_path / "n.json"), "--no-progress"], "step_cache"),
        (["bench", config, "--no-progress"], "bench"),
        (["preprocess", str(tmp_path / "videos"), str(tmp_path / "pre"), "--model", str(folder)],
         "preprocess"),
        (["train-vae", "--family", toy.FAMILY, "--no-progress"], "train_vae"),
        (["plan", config, "--train", "lora.rank=4"], "lora"),
        (["plan", config, "model.quantize=int8"], "quantize"),
        (["train", config, f"init_from={folder}", "--no-progress"], "init_from"),
        (["train", config, "lora.rank=4", "--no-progress"], "lora"),
    ]
    for argv, capability in cases:
        refused(capsys, argv, capability)
    assert not out.exists() and not (tmp_path / "a.mp4").exists()
    assert not (tmp_path / "n.json").exists() and not (tmp_path / "pre").exists()


def test_apis_refuse_an_undeclared_capability(toy, folder):
    import ditax
    from ditax.models.base import family_class

    with pytest.raises(MissingCapability, match=r"model family 'toythird' has no transformer "
                                                r"loader \(capability 'transformer'"):
        ditax.load_transformer(str(folder))
    fam = family_class(toy.FAMILY)(toy.ToyThirdConfig())
    for call, capability in ((lambda: fam.random_inputs(1), "bench"),
                             (lambda: fam.lora_table(), "lora"),
                             (lambda: fam.weights_folder(folder), "init_from"),
                             (lambda: type(fam).load_encoders(folder), "preprocess"),
                             (lambda: type(fam).trainer("vae"), None)):
        with pytest.raises(ConfigError) as e:
            call()
        assert "toythird" in str(e.value) and "\n" not in str(e.value)
        if capability:
            assert f"capability {capability!r}" in str(e.value)


def test_load_pipeline_refuses_what_the_family_does_not_declare(toy, folder):
    import ditax

    for kwargs, capability in ((dict(quantize="int8"), "quantize"),
                               (dict(loras=[("any.safetensors", 1.0)]), "lora")):
        with pytest.raises(MissingCapability, match=rf"model family 'toythird' has no .* "
                                                    rf"\(capability '{capability}'"):
            ditax.load_pipeline(folder, **kwargs)
    assert ditax.load_pipeline(folder) is not None      # without them it loads
