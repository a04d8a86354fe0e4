"""diffusers ``WanVACETransformer3DModel`` weights ↔ ditax parameters: Wan's table
(:mod:`.convert`) plus the VACE rows, and the VACE transformer's builders.

The VACE blocks are Wan blocks (the same rows, under ``vace_blocks.{i}`` with the VACE depth)
plus ``proj_out``; block 0's ``proj_in`` is one unstacked parameter (``vace_proj_in``), the
control context's Conv3d ``vace_patch_embedding`` another.
"""

from __future__ import annotations

import dataclasses

from ditax.io.convert import CONV3D, ID, TRANSPOSE, Row, Table, logical_axes
from ditax.models.common import loaded
from ditax.models.wan import convert
from ditax.models.wan.vace import WanVaceTransformer


def _linear(path, key, axes_in, axes_out, layers=None):
    return [Row(path + ("kernel",), key + ".weight", TRANSPOSE, (axes_in, axes_out),
                layers=layers),
            Row(path + ("bias",), key + ".bias", ID, (axes_out,), layers=layers)]


def vace_rows(num_vace: int, cross_attn_norm: bool, head_dim: int) -> list[Row]:
    """The rows the VACE branch adds to Wan's (``num_vace`` = ``len(vace_layers)``)."""
    base = convert.table(cross_attn_norm, head_dim=head_dim)
    rows = [dataclasses.replace(r, path=("vace_blocks",) + r.path[1:],
                                key="vace_" + r.key, layers=num_vace)
            for r in base if r.stacked]
    rows += _linear(("vace_blocks", "proj_out"), "vace_blocks.{i}.proj_out", "embed", None,
                    num_vace)
    rows += _linear(("vace_proj_in",), "vace_blocks.0.proj_in", "embed", None)
    rows += [Row(("vace_patch_embedding_kernel",), "vace_patch_embedding.weight", CONV3D,
                 ("kernel_t", "kernel_h", "kernel_w", "in_channels", "embed")),
             Row(("vace_patch_embedding_bias",), "vace_patch_embedding.bias", ID, ("embed",))]
    return rows


def table(cfg) -> list[Row]:
    """All rows of a :class:`~ditax.models.wan.vace.WanVaceConfig` (Wan's, then VACE's)."""
    return (convert.table(**convert.table_options(cfg))
            + vace_rows(len(cfg.vace_layers), cfg.cross_attn_norm, cfg.attention_head_dim))


def config_weight_table(cfg) -> Table:
    """The VACE transformer's :class:`~ditax.io.convert.Table`."""
    return Table("transformer", tuple(table(cfg)), cfg.num_layers, convert.IGNORED_UNEXPECTED,
                 f"the config (num_layers={cfg.num_layers}, cross_attn_norm="
                 f"{cfg.cross_attn_norm}, vace_layers={list(cfg.vace_layers)})")


def config_param_axes(cfg) -> dict[tuple[str, ...], tuple]:
    """Our parameter path → logical axes (stacked rows get a leading "layers")."""
    return logical_axes(table(cfg))


_BUILD = loaded.Builder(WanVaceTransformer, config_param_axes)
param_shardings = _BUILD.param_shardings
abstract_model = _BUILD.abstract_model
init_model = _BUILD.init_model

__all__ = ["abstract_model", "config_param_axes", "config_weight_table", "init_model",
           "param_shardings", "table", "vace_rows"]
