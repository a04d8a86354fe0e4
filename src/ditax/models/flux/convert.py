"""diffusers ``FluxTransformer2DModel`` weights ↔ ditax parameters: one table.

Each row: our parameter path, the diffusers key (``{i}`` = block index of a stacked row; the
double and single stacks have their own depths, :attr:`ditax.io.convert.Row.layers`), the
explicit transform, and the logical axes used for sharding (``embed`` over fsdp / context,
``heads`` / ``mlp`` over tensor). The same table drives loading (key and shape checks,
sharded reads: :mod:`ditax.io.convert`) and the parameter PartitionSpecs
(:func:`param_axes`).
"""

from __future__ import annotations

from ditax.io.convert import ID, TRANSPOSE, Row
from ditax.models.common.bfl.convert import DOUBLE, SINGLE, norm_rows, table_readers
from ditax.models.flux.config import FluxConfig

def _linear(path, key, axes_in, axes_out, layers=None):
    return [Row(path + ("kernel",), key + ".weight", TRANSPOSE, (axes_in, axes_out),
                layers=layers),
            Row(path + ("bias",), key + ".bias", ID, (axes_out,), layers=layers)]


def _attention(stack: str, depth: int, added: bool) -> list[Row]:
    path, key = (stack, "attn"), f"{stack}.{{i}}.attn"
    rows = []
    for p in ("to_q", "to_k", "to_v"):
        rows += _linear(path + (p,), f"{key}.{p}", "embed", "heads", depth)
    rows += norm_rows(path + ("norm_q",), f"{key}.norm_q", depth)
    rows += norm_rows(path + ("norm_k",), f"{key}.norm_k", depth)
    if added:
        rows += _linear(path + ("to_out",), f"{key}.to_out.0", "heads", "embed", depth)
        for p in ("add_q_proj", "add_k_proj", "add_v_proj"):
            rows += _linear(path + (p,), f"{key}.{p}", "embed", "heads", depth)
        rows += norm_rows(path + ("norm_added_q",), f"{key}.norm_added_q", depth)
        rows += norm_rows(path + ("norm_added_k",), f"{key}.norm_added_k", depth)
        rows += _linear(path + ("to_add_out",), f"{key}.to_add_out", "heads", "embed", depth)
    return rows


def _double_rows(depth: int) -> list[Row]:
    rows = _attention(DOUBLE, depth, added=True)
    for n in ("norm1", "norm1_context"):
        rows += _linear((DOUBLE, n, "linear"), f"{DOUBLE}.{{i}}.{n}.linear", "embed", None,
                        depth)
    for ff in ("ff", "ff_context"):
        rows += _linear((DOUBLE, ff, "proj_in"), f"{DOUBLE}.{{i}}.{ff}.net.0.proj", "embed",
                        "mlp", depth)
        rows += _linear((DOUBLE, ff, "proj_out"), f"{DOUBLE}.{{i}}.{ff}.net.2", "mlp", "embed",
                        depth)
    return rows


def _single_rows(depth: int) -> list[Row]:
    rows = _attention(SINGLE, depth, added=False)
    rows += _linear((SINGLE, "norm", "linear"), f"{SINGLE}.{{i}}.norm.linear", "embed", None,
                    depth)
    rows += _linear((SINGLE, "proj_mlp"), f"{SINGLE}.{{i}}.proj_mlp", "embed", "mlp", depth)
    # proj_out reads [attention heads (D); MLP (M)]: its rows are two blocks, so they stay
    # whole on every tensor shard (each block is contracted with its own sharded input)
    rows += _linear((SINGLE, "proj_out"), f"{SINGLE}.{{i}}.proj_out", None, "embed", depth)
    return rows


def table(cfg: FluxConfig) -> list[Row]:
    """The rows (our path, diffusers key, transform, logical axes) of ``cfg``'s model."""
    tte, tk = ("time_text_embed",), "time_text_embed"
    embedders = ["timestep_embedder", "text_embedder"]
    if cfg.guidance_embeds:
        embedders.insert(1, "guidance_embedder")
    rows = _linear(("x_embedder",), "x_embedder", "in_channels", "embed")
    rows += _linear(("context_embedder",), "context_embedder", "text_embed", None)
    for e in embedders:
        rows += _linear(tte + (e, "linear_1"), f"{tk}.{e}.linear_1",
                        "text_embed" if e == "text_embedder" else "freq", "embed")
        rows += _linear(tte + (e, "linear_2"), f"{tk}.{e}.linear_2", "embed", None)
    rows += _double_rows(cfg.num_layers) + _single_rows(cfg.num_single_layers)
    rows += _linear(("norm_out", "linear"), "norm_out.linear", "embed", None)
    rows += _linear(("proj_out",), "proj_out", "embed", "out_channels")
    return rows


#: the transformer's :class:`~ditax.io.convert.Table` for ``cfg``; our parameter path →
#: logical axis names (stacked blocks: a leading "layers")
weight_table, param_axes = table_readers(table)


__all__ = ["table", "weight_table", "param_axes"]
