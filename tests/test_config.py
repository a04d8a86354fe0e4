"""Config loading, overrides, validation messages, mesh, rules, and the small CLI commands."""

import json

import jax
import pytest

from ditax import config as C
from ditax.cli import main as cli_main
from ditax.parallel import make_mesh, param_spec
from jax.sharding import PartitionSpec as P


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
])
def test_override_errors(override, msg):
    with pytest.raises(C.ConfigError, match=msg):
        C.load_config("tiny", [override])


@pytest.mark.parametrize("override,msg", [
    (["attention.backend=ulysess"], r"attention.backend='ulysess' is not one of .*did you mean 'ulysses'"),
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
    (["model.remat=some"], r"model.remat='some'"),
])
def test_validation_errors(override, msg):
    cfg = C.load_config("tiny", override)
    with pytest.raises(C.ConfigError, match=msg):
        C.validate(cfg, 8, training=True)


def test_mesh_and_param_rules():
    mesh = make_mesh({"data": 1, "fsdp": 2, "context": 2, "tensor": 2})
    assert mesh.axis_names == ("data", "fsdp", "context", "tensor")
    assert dict(mesh.shape) == {"data": 1, "fsdp": 2, "context": 2, "tensor": 2}
    assert param_spec(("embed", "heads"), mesh, (128, 64)) == P(("fsdp", "context"), "tensor")
    # a dimension the axes do not divide is replicated along them (parameters only)
    assert param_spec(("embed",), mesh, (6,)) == P("fsdp")
    assert param_spec(("embed",), mesh, (3,)) == P(None)
    full = make_mesh({"fsdp": -1})
    assert full.shape["fsdp"] == jax.device_count()


def test_plan_bench_convert_cli(tmp_path, capsys):
    assert cli_main(["plan", "tiny", "mesh.fsdp=2", "mesh.context=4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mesh"]["context"] == 4
    assert out["param_bytes_per_device"] * 4 <= out["param_bytes_total"]
    assert cli_main(["bench", "tiny", "--latent", "1,8,8", "--text-len", "4",
                     "--repeats", "1"]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["metric"] == "forward" and line["value"] > 0
    from wan_reference import make_diffusers_wan

    _, folder = make_diffusers_wan(tmp_path, layers=1)
    assert cli_main(["convert", str(folder)]) == 0
    assert "OK" in capsys.readouterr().out
