"""diffusers ``Flux2Transformer2DModel`` weights ↔ ditax parameters: one table.

Each row: our parameter path, the diffusers key (``{i}`` = block index of a stacked row; the
double and single stacks have their own depths, :attr:`ditax.io.convert.Row.layers`), the
explicit transform, and the logical axes used for sharding (``embed`` over fsdp / context,
``heads`` / ``mlp`` over tensor). No FLUX.2 linear has a bias, so every linear is one row.
The double blocks' q / k / v kernels are stored head-major ``[N, D, K]``.
The fused projections (the single blocks' ``to_qkv_mlp_proj`` / ``to_out``, the SwiGLU
inputs ``linear_in``) hold blocks of columns / rows of different kinds, so they stay whole
over ``tensor`` (``None``) and are sharded over ``embed`` only.
"""

from __future__ import annotations

from ditax.io.convert import TRANSPOSE, Row, heads_out
from ditax.models.common.bfl.convert import DOUBLE, SINGLE, norm_rows, table_readers
from ditax.models.flux2.config import Flux2Config

def _linear(path, key, axes_in, axes_out, layers=None):
    return [Row(path + ("kernel",), key + ".weight", TRANSPOSE, (axes_in, axes_out),
                layers=layers)]


def _double_rows(depth: int, head_dim: int) -> list[Row]:
    path, key = (DOUBLE, "attn"), f"{DOUBLE}.{{i}}.attn"
    rows = []
    for p in ("to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj"):
        # stored head-major [N, D, K] (Linear out_heads): the layout the head-major q / k / v
        # dot reads as it lies (an [D, N·K] kernel was transposed every layer on a v5e)
        rows.append(Row(path + (p, "kernel"), f"{key}.{p}.weight", heads_out(head_dim),
                        ("heads", "embed", None), layers=depth))
    for n in ("norm_q", "norm_k", "norm_added_q", "norm_added_k"):
        rows += norm_rows(path + (n,), f"{key}.{n}", depth)
    rows += _linear(path + ("to_out",), f"{key}.to_out.0", "heads", "embed", depth)
    rows += _linear(path + ("to_add_out",), f"{key}.to_add_out", "heads", "embed", depth)
    for ff in ("ff", "ff_context"):
        rows += _linear((DOUBLE, ff, "linear_in"), f"{DOUBLE}.{{i}}.{ff}.linear_in", "embed",
                        None, depth)
        rows += _linear((DOUBLE, ff, "linear_out"), f"{DOUBLE}.{{i}}.{ff}.linear_out", "mlp",
                        "embed", depth)
    return rows


def _single_rows(depth: int) -> list[Row]:
    path, key = (SINGLE, "attn"), f"{SINGLE}.{{i}}.attn"
    rows = _linear(path + ("to_qkv_mlp_proj",), f"{key}.to_qkv_mlp_proj", "embed", None, depth)
    rows += norm_rows(path + ("norm_q",), f"{key}.norm_q", depth)
    rows += norm_rows(path + ("norm_k",), f"{key}.norm_k", depth)
    rows += _linear(path + ("to_out",), f"{key}.to_out", None, "embed", depth)
    return rows


def table(cfg: Flux2Config) -> list[Row]:
    """The rows (our path, diffusers key, transform, logical axes) of ``cfg``'s model."""
    tge = "time_guidance_embed"
    embedders = ["timestep_embedder"] + (["guidance_embedder"] if cfg.guidance_embeds else [])
    rows = _linear(("x_embedder",), "x_embedder", "in_channels", "embed")
    rows += _linear(("context_embedder",), "context_embedder", "text_embed", None)
    for e in embedders:
        rows += _linear((tge, e, "linear_1"), f"{tge}.{e}.linear_1", "freq", "embed")
        rows += _linear((tge, e, "linear_2"), f"{tge}.{e}.linear_2", "embed", None)
    for m in ("double_stream_modulation_img", "double_stream_modulation_txt",
              "single_stream_modulation", "norm_out"):
        rows += _linear((m, "linear"), f"{m}.linear", "embed", None)
    rows += (_double_rows(cfg.num_layers, cfg.attention_head_dim)
             + _single_rows(cfg.num_single_layers))
    rows += _linear(("proj_out",), "proj_out", "embed", "out_channels")
    return rows


#: the transformer's :class:`~ditax.io.convert.Table` for ``cfg``; our parameter path →
#: logical axis names (stacked blocks: a leading "layers")
weight_table, param_axes = table_readers(table)


__all__ = ["table", "weight_table", "param_axes"]
