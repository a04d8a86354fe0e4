"""diffusers ``WanTransformer3DModel`` weights ↔ ditax parameters: one table.

Each row: our parameter path, the diffusers key (``{i}`` = block index for the stacked
blocks), the explicit transform, and the logical axis names used for sharding. The same table
drives loading and export (:mod:`ditax.io.convert`: key and shape checks, sharded reads) and
the parameter PartitionSpecs (:func:`param_axes`).
"""

from __future__ import annotations

from ditax.io.convert import CONV3D, ID, TRANSPOSE, Row, Table, heads_out, logical_axes


def _linear(path, key, axes_in, axes_out):
    return [Row(path + ("kernel",), key + ".weight", TRANSPOSE, (axes_in, axes_out)),
            Row(path + ("bias",), key + ".bias", ID, (axes_out,))]


def _heads_linear(path, key, head_dim: int):
    """An attention projection stored head-major: kernel ``[N, D_in, K]`` (the layout the
    head-major q / k / v dot reads; :class:`ditax.nn.Linear` ``out_heads``), bias ``[N·K]``."""
    return [Row(path + ("kernel",), key + ".weight", heads_out(head_dim),
                ("heads", "embed", None)),
            Row(path + ("bias",), key + ".bias", ID, ("heads",))]


def _image_rows(pos_embed: bool) -> list[Row]:
    """The image embedder (image-to-video) and, for first-last-frame models, its pos_embed."""
    path, key = ("condition_embedder", "image_embedder"), "condition_embedder.image_embedder"
    rows = [Row(path + (n, p), f"{key}.{n}.{k}", ID, ("norm",))
            for n in ("norm1", "norm2") for p, k in (("scale", "weight"), ("bias", "bias"))]
    rows += _linear(path + ("proj_in",), key + ".ff.net.0.proj", None, None)
    rows += _linear(path + ("proj_out",), key + ".ff.net.2", None, None)
    if pos_embed:
        rows.append(Row(path + ("pos_embed",), key + ".pos_embed", ID, (None, None, None)))
    return rows


def _added_kv_rows(head_dim: int) -> list[Row]:
    """Cross-attention K/V projections of the image tokens (image-to-video)."""
    rows = []
    for p in ("add_k_proj", "add_v_proj"):
        rows += _heads_linear(("blocks", "attn2", p), f"blocks.{{i}}.attn2.{p}", head_dim)
    rows.append(Row(("blocks", "attn2", "norm_added_k", "scale"),
                    "blocks.{i}.attn2.norm_added_k.weight", ID, ("heads",)))
    return rows


def _block_rows(cross_attn_norm: bool, head_dim: int) -> list[Row]:
    rows = []
    for a in ("attn1", "attn2"):
        for p in ("to_q", "to_k", "to_v"):
            rows += _heads_linear(("blocks", a, p), f"blocks.{{i}}.{a}.{p}", head_dim)
        rows += _linear(("blocks", a, "to_out"), f"blocks.{{i}}.{a}.to_out.0", "heads", "embed")
        rows += [Row(("blocks", a, "norm_q", "scale"), f"blocks.{{i}}.{a}.norm_q.weight", ID,
                     ("heads",)),
                 Row(("blocks", a, "norm_k", "scale"), f"blocks.{{i}}.{a}.norm_k.weight", ID,
                     ("heads",))]
    rows += _linear(("blocks", "ffn", "proj_in"), "blocks.{i}.ffn.net.0.proj", "embed", "mlp")
    rows += _linear(("blocks", "ffn", "proj_out"), "blocks.{i}.ffn.net.2", "mlp", "embed")
    if cross_attn_norm:
        rows += [Row(("blocks", "norm2", "scale"), "blocks.{i}.norm2.weight", ID, ("norm",)),
                 Row(("blocks", "norm2", "bias"), "blocks.{i}.norm2.bias", ID, ("norm",))]
    rows.append(Row(("blocks", "scale_shift_table"), "blocks.{i}.scale_shift_table", ID,
                    (None, "modulation", "embed")))
    return rows


def table(cross_attn_norm: bool = True, image: bool = False, pos_embed: bool = False, *,
          head_dim: int) -> list[Row]:
    """The rows (our path, diffusers key, transform, logical axes); ``image`` adds the
    image-to-video parameters, ``pos_embed`` the first-last-frame position table;
    ``head_dim`` splits the q / k / v kernels head-major."""
    ce = ("condition_embedder",)
    extra = (_image_rows(pos_embed) + _added_kv_rows(head_dim)) if image else []
    return [
        Row(("patch_embedding_kernel",), "patch_embedding.weight", CONV3D,
            ("kernel_t", "kernel_h", "kernel_w", "in_channels", "embed")),
        Row(("patch_embedding_bias",), "patch_embedding.bias", ID, ("embed",)),
        *_linear(ce + ("time_embedder", "linear_1"), "condition_embedder.time_embedder.linear_1",
                 "freq", "embed"),
        *_linear(ce + ("time_embedder", "linear_2"), "condition_embedder.time_embedder.linear_2",
                 "embed", None),
        *_linear(ce + ("time_proj",), "condition_embedder.time_proj", "embed", None),
        *_linear(ce + ("text_embedder", "linear_1"), "condition_embedder.text_embedder.linear_1",
                 "text_embed", None),
        *_linear(ce + ("text_embedder", "linear_2"), "condition_embedder.text_embedder.linear_2",
                 "embed", None),
        *_block_rows(cross_attn_norm, head_dim),
        *extra,
        *_linear(("proj_out",), "proj_out", "embed", None),
        Row(("scale_shift_table",), "scale_shift_table", ID, (None, "modulation", "embed")),
    ]


IGNORED_UNEXPECTED = ("norm_added_q",)  # diffusers also ignores these on load


def weight_table(num_layers: int, cross_attn_norm: bool = True, image: bool = False,
                 pos_embed: bool = False, *, head_dim: int) -> Table:
    """The transformer's :class:`~ditax.io.convert.Table` for a config's layer count and
    head dim."""
    extra = f", image_dim set, pos_embed={pos_embed}" if image else ""
    return Table("transformer", tuple(table(cross_attn_norm, image, pos_embed,
                                            head_dim=head_dim)), num_layers,
                 IGNORED_UNEXPECTED,
                 f"the config (num_layers={num_layers}, cross_attn_norm={cross_attn_norm}{extra})")


def param_axes(cross_attn_norm: bool = True, image: bool = False, pos_embed: bool = False, *,
               head_dim: int) -> dict[tuple[str, ...], tuple]:
    """Our parameter path → logical axis names (the stacked blocks get a leading "layers")."""
    return logical_axes(table(cross_attn_norm, image, pos_embed, head_dim=head_dim))


def table_options(cfg) -> dict:
    """The keyword arguments of :func:`weight_table` / :func:`param_axes` after the layer
    count, for a :class:`~ditax.models.wan.config.ModelConfig`."""
    return dict(cross_attn_norm=cfg.cross_attn_norm, image=cfg.image_dim is not None,
                pos_embed=cfg.pos_embed_seq_len is not None, head_dim=cfg.attention_head_dim)


def config_weight_table(cfg) -> Table:
    """:func:`weight_table` for a model config."""
    return weight_table(cfg.num_layers, **table_options(cfg))


def config_param_axes(cfg) -> dict[tuple[str, ...], tuple]:
    """:func:`param_axes` for a model config."""
    return param_axes(**table_options(cfg))
