"""Config loading, overrides, validation messages and the family registry's config side."""

import dataclasses
from typing import Literal

import pytest
import yaml

from ditax import config as C
from ditax.attention.config import ATTENTION_BACKENDS


def test_presets_load_and_validate():
    for name in C.preset_names():
        cfg = C.load_config(name)
        C.validate(cfg, 8)
    assert C.load_config("wan2.1-t2v-14b").model.inner_dim == 5120
    assert C.load_config("wan2.2-t2v-a14b").sample.guidance_scale_2 == 3.0   # base: inherits


def test_overrides_are_typed():
    cfg = C.load_config("tiny", ["mesh.fsdp=4", "mesh.tensor=2", "model.remat=full",
                                 "optim.learning_rate=3e-4", "model.patch_size=1,2,2",
                                 "attention.cross_backend=none", "data.shuffle=false"])
    assert cfg.mesh.fsdp == 4 and cfg.mesh.tensor == 2
    assert cfg.model.remat == "full" and cfg.optim.learning_rate == 3e-4
    assert cfg.model.patch_size == (1, 2, 2) and cfg.attention.cross_backend is None
    assert cfg.data.shuffle is False


@pytest.mark.parametrize("override,msg", [
    ("mesh.fsdpp=8", r"unknown config key 'mesh.fsdpp'; did you mean mesh.fsdp"),
    ("fsdp=8", r"did you mean mesh.fsdp"),
    ("mesh.fsdp=two", r"mesh.fsdp='two': expected an integer"),
    ("model.scan_layers=maybe", r"expected a boolean"),
    ("mesh", r"not of the form key=value"),
    ("mesh=8", r"'mesh' names a section; set one of its keys, e.g. mesh.data"),
    ("attention.backend=ulysess", r"attention.backend='ulysess' is not one of .*did you mean 'ulysses'"),
    ("model.remat=some", r"model.remat='some' is not one of none, full"),
    ("model.dtype=bf16", r"did you mean 'bfloat16'"),
    ("attention.cross_backend=ring", r"attention.cross_backend='ring' is not one of auto, "),
    ("sample.scheduler=ddim", r"sample.scheduler='ddim' is not one of unipc, euler"),
    ("optim.schedule=step", r"optim.schedule='step' is not one of constant, cosine, linear"),
    ("model.patch_size=1,2", r"model.patch_size='1,2': expected a list of 3 values"),
    ("model.num_layers=2.5", r"model.num_layers='2.5': expected an integer"),
    ("sample.flow_shift=big", r"sample.flow_shift='big': expected a number or none"),
    ("model.family=nope", r"model.family='nope' is not one of flux, flux2, ltx2, wan"),
])
def test_override_errors(override, msg):
    with pytest.raises(C.ConfigError, match=msg):
        C.load_config("tiny", [override])


@pytest.mark.parametrize("override,msg", [
    (["mesh.fsdp=-1", "mesh.context=3"], r"multiply to 3, which does not divide the 8 devices"),
    (["mesh.fsdp=3"], r"= 3, but there are 8 devices"),
    (["mesh.fsdp=-1", "mesh.context=-1"], r"at most one mesh axis may be -1"),
    (["mesh.fsdp=2", "mesh.tensor=8"], r"product 16|= 16, but there are 8 devices"),
    (["mesh.fsdp=1", "mesh.tensor=8"], r"num_attention_heads=4 is not divisible by mesh.tensor=8"),
    (["mesh.fsdp=8", "batch_size=4"], r"batch_size=4 is not divisible by mesh.data\*mesh.fsdp"),
    (["attention.out_a2a=shard_major"], r"out_a2a='shard_major' applies to the Ulysses"),
    (["mesh.fsdp=1", "mesh.context=8", "attention.backend=ulysses", "model.num_attention_heads=6",
      "model.attention_head_dim=16"], r"6 heads .* not divisible by the 8 Ulysses shards"),
    (["mesh.fsdp=1", "mesh.context=8", "attention.backend=ulysses_ring",
      "attention.ulysses_shards=3"], r"ulysses_shards=3 does not divide mesh.context=8"),
    (["optim.learning_rate=0"], r"optim.learning_rate=0.0 must be > 0"),
    (["optim.b2=1"], r"optim.b2=1.0 must be in \[0, 1\)"),
    (["flow.shift=0"], r"flow.shift=0.0 must be > 0"),
    (["data.height=0"], r"data.height=0 must be >= 1"),
    (["checkpoint.every=0"], r"checkpoint.every=0 must be >= 1"),
    (["sample.flow_shift=-1"], r"sample.flow_shift=-1.0 must be > 0"),
    (["model.freq_dim=31"], r"model.freq_dim=31 must be even"),
])
def test_validation_errors(override, msg):
    cfg = C.load_config("tiny", override)
    with pytest.raises(C.ConfigError, match=msg):
        C.validate(cfg, 8, training=True)


@pytest.mark.parametrize("key,value,msg", [
    ("model.remat", "some", r"model.remat='some' is not one of"),
    ("attention.backend", "ulysess", r"did you mean 'ulysses'"),
    ("flow.weighting", "cosine", r"flow.weighting='cosine' is not one of none, bell"),
    ("sample.cfg_mode", "both", r"sample.cfg_mode='both' is not one of batched, sequential"),
])
def test_validate_checks_literals_of_built_configs(key, value, msg):
    """Configs built in code skip the loader; validate still names a bad Literal value."""
    cfg = C.replace(C.load_config("tiny"), **{key: value})
    with pytest.raises(C.ConfigError, match=msg):
        C.validate(cfg)


def test_literal_lists_have_one_source():
    for b in ATTENTION_BACKENDS:
        assert C.load_config(None, [f"attention.backend={b}"]).attention.backend == b
    assert C.parse_overrides(["attention.cross_backend=none", "model.patch_size=(1,4,4)",
                              "name=123", "mesh.fsdp=8"]) == {
        "attention": {"cross_backend": None}, "model": {"patch_size": [1, 4, 4]},
        "name": "123", "mesh": {"fsdp": 8}}


def test_yaml_base_unknown_keys_and_round_trip(tmp_path):
    child = tmp_path / "child.yaml"
    child.write_text("base: tiny\nmesh: {fsdp: 2, context: -1}\n")
    cfg = C.load_config(str(child))
    assert (cfg.mesh.fsdp, cfg.mesh.context, cfg.model.num_layers) == (2, -1, 2)
    bad = tmp_path / "bad.yaml"
    bad.write_text("base: tiny\nmesh: {fsdpp: 2}\n")
    with pytest.raises(C.ConfigError, match=r"unknown config key 'mesh.fsdpp'; did you mean mesh.fsdp"):
        C.load_config(str(bad))
    with pytest.raises(C.ConfigError, match=r"neither a YAML file nor a preset; presets: .*tiny"):
        C.load_config("tinny")
    again = tmp_path / "again.yaml"
    again.write_text(yaml.safe_dump(C.to_dict(cfg)))
    assert C.load_config(str(again)) == cfg
    assert C.replace(cfg, **{"mesh.fsdp": 4, "steps": 3}).mesh.fsdp == 4


@dataclasses.dataclass(frozen=True)
class ToyModelConfig:
    family: Literal["toy"] = "toy"
    num_attention_heads: int = 2
    width: int = 8


def _check_toy(m, mesh_sizes):
    if m.width % 2:
        raise C.ConfigError(f"model.width={m.width} must be even")


def test_model_family_registry(monkeypatch):
    from ditax.models import base

    class ToyRules(base.ModelFamily):     # the runtime side: only the rules matter here
        name = "toy"
        latent_channels = text_dim = 1
        latent_grid = classmethod(lambda cls, f, h, w: (f, h, w))
        tokens_per_sample = flops_per_sample = create = param_shardings = (
            lambda self, *a: None)

        def check(self, mesh_sizes=None):
            _check_toy(self.model, mesh_sizes)

    from ditax.models import registry

    registry.spec("wan")   # registered before the copy, so it outlives the test's toy
    monkeypatch.setattr(registry, "_SPECS", dict(registry._SPECS))
    C.register_config_family(ToyModelConfig)
    base.register_family(ToyRules)
    cfg = C.load_config(None, ["model.family=toy", "model.width=4", "mesh.context=2"])
    assert cfg.model == ToyModelConfig(width=4) and cfg.mesh.context == 2
    C.validate(cfg, 8)
    with pytest.raises(C.ConfigError, match=r"model.width=3 must be even"):
        C.validate(C.load_config(None, ["model.family=toy", "model.width=3"]))
    with pytest.raises(C.ConfigError, match=r"unknown config key 'model.remat'"):
        C.load_config(None, ["model.family=toy", "model.remat=full"])
    with pytest.raises(C.ConfigError, match=r"model.family='toys' is not one of flux, flux2, ltx2, toy, wan"):
        C.load_config(None, ["model.family=toys"])


def test_validate_uses_the_batch_divisibility_message():
    msg = r"is not divisible by mesh.data\*mesh.fsdp = 2\*4 = 8; use a batch that is a multiple"
    with pytest.raises(C.ConfigError, match=r"batch_size=6 " + msg):
        C.validate(C.load_config("tiny", ["mesh.data=2", "mesh.fsdp=4", "batch_size=6"]), 8,
                   training=True)
