"""A tiny random Wan transformer folder for the 8-bit tests (ditax's own export: no torch)."""

import json

import jax
import numpy as np
from flax import nnx
from safetensors.numpy import save_file

# 2 heads x 16, 2 layers, FFN 64: block linears 32 x 32 (attention) and 32 <-> 64 (FFN)
WAN = dict(num_attention_heads=2, attention_head_dim=16, ffn_dim=64, num_layers=2,
           in_channels=4, out_channels=4, text_dim=32, freq_dim=32)


def write_wan_folder(folder, seed: int = 0):
    """``folder`` (created) as a diffusers Wan transformer folder of :data:`WAN` with weights
    drawn ``0.2 · N(0, 1)`` from ``seed``; returns ``folder``."""
    from ditax.io.convert import export
    from ditax.models.wan.build import abstract_model
    from ditax.models.wan.config import WanConfig
    from ditax.models.wan.convert import config_weight_table

    cfg = WanConfig(**WAN)
    gen = np.random.default_rng(seed)
    params = jax.tree.map(lambda a: (0.2 * gen.standard_normal(a.shape)).astype(np.float32),
                          nnx.to_pure_dict(nnx.state(abstract_model(cfg))))
    folder.mkdir()
    save_file({k: np.ascontiguousarray(v) for k, v in
               export(config_weight_table(cfg), params).items()},
              str(folder / "diffusion_pytorch_model.safetensors"))
    (folder / "config.json").write_text(json.dumps(cfg.to_diffusers()))
    return folder
