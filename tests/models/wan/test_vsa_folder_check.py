"""``check_folder`` of a VSA-trained transformer folder (what ``ditax export`` writes of an
``attention.sparsity=vsa`` run, and then checks): its gate tensors are the gated model's
optional rows, checked by shape; a dense folder still passes; a gate of the wrong shape fails."""

from __future__ import annotations

import json

import numpy as np
import pytest
from flax import nnx

import ditax
from ditax.config import AttentionConfig
from ditax.errors import WeightError
from ditax.io.export import save_folder
from ditax.models.wan.convert import config_weight_table
from ditax.models.wan.folder_check import check_folder


def _write(tmp_path, gate_shape=None):
    path = ditax.demo.model_path()
    acfg = AttentionConfig(backend="xla", sparsity="vsa", tile=(1, 2, 2), topk=3)
    vsa = ditax.load_transformer(path, attention=acfg).module
    params = nnx.to_pure_dict(nnx.state(vsa))
    if gate_shape is not None:
        params["blocks"]["attn1"]["to_gate_compress"]["bias"] = np.zeros(gate_shape,
                                                                          np.float32)
    config = json.loads((path / "transformer" / "config.json").read_text())
    save_folder(tmp_path, "diffusion_pytorch_model.safetensors",
                config_weight_table(vsa.cfg, gated=True), params, config)
    return path


def test_a_gated_folder_passes_with_its_gates_counted(tmp_path):
    dense = check_folder(_write(tmp_path))
    gated = check_folder(tmp_path, None)
    assert gated.num_tensors == dense.num_tensors + 8         # 4 layers x (weight, bias)
    assert gated.num_params == dense.num_params + 4 * (320 * 320 + 320)


def test_a_gate_of_the_wrong_shape_fails(tmp_path):
    _write(tmp_path, gate_shape=(4, 319))
    with pytest.raises(WeightError, match="to_gate_compress"):
        check_folder(tmp_path, None)


def test_a_gated_folder_loaded_dense_names_the_setting(tmp_path):
    """Loaded without ``attention.sparsity=vsa`` the gates are unexpected keys: the error's
    fix names the setting (the folder does not record it), not the general advice."""
    _write(tmp_path)
    with pytest.raises(WeightError, match=r"to_gate_compress.*load it with "
                                          r"attention\.sparsity=vsa attention\.topk=K") as e:
        ditax.load_transformer(tmp_path, attention="xla", subfolder=None)
    assert "config.json belongs" not in str(e.value)


def test_the_gates_hint_only_when_the_gates_are_all_that_differs():
    from ditax.models.wan.convert import weight_table

    table = weight_table(2, head_dim=64)
    gates = ["blocks.0.attn1.to_gate_compress.weight", "blocks.1.attn1.to_gate_compress.bias"]
    assert "attention.sparsity=vsa" in table.fix_for([], gates)
    general = "config.json belongs"
    assert general in table.fix_for([], gates + ["blocks.0.other.weight"])
    assert general in table.fix_for(["blocks.0.attn1.to_q.weight"], gates)
    assert general in table.fix_for(["blocks.0.attn1.to_q.weight"], [])
