"""diffusers ``WanVACETransformer3DModel`` weights ↔ ditax parameters: Wan's table
(:mod:`.convert`) plus the VACE rows, and the VACE transformer's builders.

The VACE blocks are Wan blocks (the same rows, under ``vace_blocks.{i}`` with the VACE depth)
plus ``proj_out``; block 0's ``proj_in`` is one unstacked parameter (``vace_proj_in``), the
control context's Conv3d ``vace_patch_embedding`` another.
"""

from __future__ import annotations

import dataclasses

from ditax.io.convert import CONV3D, ID, Row
from ditax.models.wan import convert
from ditax.models.wan.convert import linear
from ditax.models.wan.vace import WanVaceTransformer


def vace_rows(cfg) -> list[Row]:
    """The rows the VACE branch adds to Wan's (``len(cfg.vace_layers)`` VACE blocks)."""
    num_vace = len(cfg.vace_layers)
    base = convert.table(cfg.cross_attn_norm, head_dim=cfg.attention_head_dim)
    rows = [dataclasses.replace(r, path=("vace_blocks",) + r.path[1:],
                                key="vace_" + r.key, layers=num_vace)
            for r in base if r.stacked]
    rows += linear(("vace_blocks", "proj_out"), "vace_blocks.{i}.proj_out", "embed", None,
                   num_vace)
    rows += linear(("vace_proj_in",), "vace_blocks.0.proj_in", "embed", None)
    rows += [Row(("vace_patch_embedding_kernel",), "vace_patch_embedding.weight", CONV3D,
                 ("kernel_t", "kernel_h", "kernel_w", "in_channels", "embed")),
             Row(("vace_patch_embedding_bias",), "vace_patch_embedding.bias", ID, ("embed",))]
    return rows


(table, config_weight_table, config_param_axes, param_shardings, abstract_model,
 init_model) = convert.Variant(WanVaceTransformer, vace_rows,
                               ("cross_attn_norm", "vace_layers")).functions()

__all__ = ["abstract_model", "config_param_axes", "config_weight_table", "init_model",
           "param_shardings", "table", "vace_rows"]
