"""The building floor every family shares: one transformer loader fed with the family's data,
one definition of the numeric config fields and of the shared part of ``check_transformer``,
one VAE-trainer base; a family declares data, not a copy of the steps."""

import dataclasses
import json

import pytest

from ditax.errors import ConfigError
from ditax.models.common.fields import TransformerNumerics
from ditax.models.flux.config import FluxConfig
from ditax.models.flux.config import check_transformer as flux_check
from ditax.models.wan.animate import WanAnimateConfig
from ditax.models.wan.config import WanConfig
from ditax.models.wan.config import check_transformer as wan_check
from ditax.models.wan.vace import WanVaceConfig

NUMERICS = [f.name for f in dataclasses.fields(TransformerNumerics)]


@pytest.mark.parametrize("cls,after", [(WanConfig, "rope_max_seq_len"),
                                       (FluxConfig, "axes_dims_rope")])
def test_numeric_fields_are_one_definition_in_their_old_place(cls, after):
    names = [f.name for f in dataclasses.fields(cls)]
    assert issubclass(cls, TransformerNumerics)
    assert NUMERICS == ["param_dtype", "dtype", "remat", "quantize", "quantize_activations",
                        "scan_layers", "offload", "offload_prefetch", "precision"]
    at = names.index(after) + 1              # the config keys keep their order
    assert names[at:at + len(NUMERICS)] == NUMERICS


def test_the_listing_reads_each_comment_where_its_field_is_declared():
    from ditax.cli.config import leaves

    for cfg in (WanConfig(), FluxConfig(), WanAnimateConfig()):
        comments = {k: v[2] for k, v in leaves(cfg).items()}
        assert comments["param_dtype"] == "storage dtype of the weights", type(cfg)
        assert comments["remat"] == "activation checkpointing policy of each block"
    animate = {k: v[2] for k, v in leaves(WanAnimateConfig()).items()}
    assert animate["image_dim"] == "CLIP feature width fed to the image embedder"
    assert animate["motion_blocks"] == "linears of the motion network (fixed)"


@pytest.mark.parametrize("check,cfg,name", [(wan_check, FluxConfig(), "WanConfig"),
                                            (flux_check, WanConfig(), "FluxConfig")])
def test_a_config_of_another_family_is_refused_in_one_line(check, cfg, name):
    with pytest.raises(ConfigError, match=rf"^model=.* is not a {name}$"):
        check(cfg)


def test_shared_numeric_rules_say_the_same_for_every_family():
    for cfg in (WanConfig(remat="most"), FluxConfig(remat="most")):
        with pytest.raises(ConfigError, match=r"model.remat"):
            (wan_check if isinstance(cfg, WanConfig) else flux_check)(cfg)
    for cfg in (WanConfig(quantize_activations=True), FluxConfig(quantize_activations=True)):
        with pytest.raises(ConfigError, match=r"quantize_activations=true needs 8-bit weights"):
            (wan_check if isinstance(cfg, WanConfig) else flux_check)(cfg)


def test_the_loader_picks_the_architecture_from_data():
    from ditax.models.flux.loading import LOADER as FLUX
    from ditax.models.wan.loading import LOADER as WAN, Transformer
    from ditax.models.wan.animate_loaded import AnimateTransformer
    from ditax.models.wan.vace_loaded import VaceTransformer

    assert WAN.architecture(WanConfig()).wrapper is Transformer
    assert WAN.architecture(WanVaceConfig()).wrapper is VaceTransformer
    assert WAN.architecture(WanAnimateConfig()).wrapper is AnimateTransformer

    @dataclasses.dataclass(frozen=True)
    class Tuned(WanVaceConfig):               # a subclass no architecture names: its base's
        note: str = ""

    assert WAN.architecture(Tuned()).wrapper is VaceTransformer
    with pytest.raises(ConfigError, match=r"^model config WanConfig is no Flux transformer"):
        FLUX.architecture(WanConfig())
    # every callable the loader returns takes new unmerged-LoRA strengths (one shared method)
    for arch in WAN.architectures + FLUX.architectures:
        assert callable(getattr(arch.wrapper, "set_lora_strengths", None)), arch.class_name


def test_a_folder_of_another_family_is_refused_naming_both(tmp_path):
    from ditax.models.flux.loading import read_config as flux_read
    from ditax.models.wan.loading import read_config as wan_read

    folder = tmp_path / "transformer"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(WanConfig(num_layers=1).to_diffusers()))
    assert wan_read(folder)["num_layers"] == 1
    with pytest.raises(ConfigError, match=r"is a WanTransformer3DModel, not a "
                                          r"FluxTransformer2DModel$"):
        flux_read(folder)
    raw = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**raw, "_class_name": "Other"}))
    with pytest.raises(ConfigError, match=r"is a Other, not a WanTransformer3DModel \(or "
                                          r"WanVACETransformer3DModel, "
                                          r"WanAnimateTransformer3DModel\)$"):
        wan_read(folder)


def test_family_vae_trainers_share_one_base():
    from ditax.train.flux.trainers import FluxVAETraining
    from ditax.train.vae_training import VAETraining
    from ditax.train.wan.trainers import WanVAETraining

    for cls in (WanVAETraining, FluxVAETraining):
        assert issubclass(cls, VAETraining)
        assert dataclasses.is_dataclass(cls.config_class)
        with pytest.raises(ConfigError, match="does not split over 3 device"):
            cls().check_devices(cls.config_class(batch_size=4), 3)


def test_the_finite_check_names_a_nan_in_any_shard_on_host_and_in_one_program():
    """On CPU the finiteness checks (load, sampling) read each distinct shard with numpy;
    they flag what the fused program (the accelerators' path) flags: a NaN in one fsdp shard,
    an inf in a replicated bias, a bfloat16 NaN, and nothing in clean tensors or integer
    leaves."""
    import jax
    import numpy as np
    from flax import nnx
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from ditax.errors import WeightError
    from ditax.finite import _finite_flags, _host_finite_flags, all_finite, on_host
    from ditax.models.common.loader import check_finite_params

    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("fsdp", "tensor"))
    rows = NamedSharding(mesh, P("fsdp", "tensor"))
    rep = NamedSharding(mesh, P())
    bad_shard = np.ones((8, 4), np.float32)
    bad_shard[5, 3] = np.nan                      # one element of one (fsdp, tensor) shard
    bad_bias = np.ones(4, np.float32)
    bad_bias[2] = np.inf
    leaves = [jax.device_put(np.ones((8, 4), np.float32), rows),
              jax.device_put(bad_shard, rows), jax.device_put(bad_bias, rep),
              jax.device_put(np.ones(4, np.float32), rep),
              jax.device_put(np.array([1.0, np.nan], jax.numpy.bfloat16), rep)]
    assert on_host(leaves)
    want = [True, False, False, True, False]
    assert _host_finite_flags(leaves) == want
    assert np.asarray(_finite_flags(leaves)).tolist() == want
    assert [all_finite(x) for x in leaves] == want                    # the sampling checks'
    assert all_finite(np.ones(3)) and not all_finite(bad_bias)

    state = nnx.State({"a": {"kernel": leaves[0], "steps": jax.device_put(np.arange(3), rep)},
                       "b": {"bias": leaves[2]}})
    with pytest.raises(WeightError, match=r"src: parameter b\.bias holds NaN / inf"):
        check_finite_params(state, "src")
    check_finite_params(nnx.State({"a": {"kernel": leaves[0]}}), "src")
