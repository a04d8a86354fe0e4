"""diffusers ``WanTransformer3DModel`` weights ↔ ditax parameters: one table.

Each row: our parameter path, the diffusers key (``{i}`` = block index for the stacked
blocks), the explicit transform, and the logical axis names used for sharding. The same table
drives loading and export (:mod:`ditax.io.convert`: key and shape checks, sharded reads) and
the parameter PartitionSpecs (:func:`param_axes`).
"""

from __future__ import annotations

from typing import Any, Callable

from ditax.io.convert import CONV3D, ID, TRANSPOSE, Row, Table, heads_out, logical_axes
from ditax.models.common.loaded import Builder


def linear(path, key, axes_in=None, axes_out=None, layers=None) -> list[Row]:
    """A torch ``Linear``'s kernel and bias rows (``layers``: a stack of that many)."""
    return [Row(path + ("kernel",), key + ".weight", TRANSPOSE, (axes_in, axes_out),
                layers=layers),
            Row(path + ("bias",), key + ".bias", ID, (axes_out,), layers=layers)]


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
    rows += linear(path + ("proj_in",), key + ".ff.net.0.proj", None, None)
    rows += linear(path + ("proj_out",), key + ".ff.net.2", None, None)
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
        rows += linear(("blocks", a, "to_out"), f"blocks.{{i}}.{a}.to_out.0", "heads", "embed")
        rows += [Row(("blocks", a, "norm_q", "scale"), f"blocks.{{i}}.{a}.norm_q.weight", ID,
                     ("heads",)),
                 Row(("blocks", a, "norm_k", "scale"), f"blocks.{{i}}.{a}.norm_k.weight", ID,
                     ("heads",))]
    rows += linear(("blocks", "ffn", "proj_in"), "blocks.{i}.ffn.net.0.proj", "embed", "mlp")
    rows += linear(("blocks", "ffn", "proj_out"), "blocks.{i}.ffn.net.2", "mlp", "embed")
    if cross_attn_norm:
        rows += [Row(("blocks", "norm2", "scale"), "blocks.{i}.norm2.weight", ID, ("norm",)),
                 Row(("blocks", "norm2", "bias"), "blocks.{i}.norm2.bias", ID, ("norm",))]
    rows.append(Row(("blocks", "scale_shift_table"), "blocks.{i}.scale_shift_table", ID,
                    (None, "modulation", "embed")))
    return rows


def gate_rows() -> list[Row]:
    """``attention.sparsity=vsa``'s gates (``attn1.to_gate_compress``; optional rows: a dense
    checkpoint leaves them zero, :attr:`~ditax.io.convert.Row.init`)."""
    return [Row(("blocks", "attn1", "to_gate_compress", p),
                f"blocks.{{i}}.attn1.to_gate_compress.{k}", t, axes, init=0.0)
            for p, k, t, axes in (("kernel", "weight", TRANSPOSE, ("embed", "heads")),
                                  ("bias", "bias", ID, ("heads",)))]


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
        *linear(ce + ("time_embedder", "linear_1"), "condition_embedder.time_embedder.linear_1",
                "freq", "embed"),
        *linear(ce + ("time_embedder", "linear_2"), "condition_embedder.time_embedder.linear_2",
                "embed", None),
        *linear(ce + ("time_proj",), "condition_embedder.time_proj", "embed", None),
        *linear(ce + ("text_embedder", "linear_1"), "condition_embedder.text_embedder.linear_1",
                "text_embed", None),
        *linear(ce + ("text_embedder", "linear_2"), "condition_embedder.text_embedder.linear_2",
                "embed", None),
        *_block_rows(cross_attn_norm, head_dim),
        *extra,
        *linear(("proj_out",), "proj_out", "embed", None),
        Row(("scale_shift_table",), "scale_shift_table", ID, (None, "modulation", "embed")),
    ]


IGNORED_UNEXPECTED = ("norm_added_q",)  # diffusers also ignores these on load


def weight_table(num_layers: int, cross_attn_norm: bool = True, image: bool = False,
                 pos_embed: bool = False, *, head_dim: int) -> Table:
    """The transformer's :class:`~ditax.io.convert.Table` for a config's layer count and
    head dim."""
    extra = f", image_dim set, pos_embed={pos_embed}" if image else ""
    return _weight_table(table(cross_attn_norm, image, pos_embed, head_dim=head_dim), num_layers,
                         f"cross_attn_norm={cross_attn_norm}{extra}")


def _weight_table(rows: list[Row], num_layers: int, fields: str) -> Table:
    """The transformer's :class:`~ditax.io.convert.Table` of ``rows``; ``fields`` names the
    config fields beside ``num_layers`` that the rows depend on (in a mismatch message)."""
    return Table("transformer", tuple(rows), num_layers, IGNORED_UNEXPECTED,
                 f"the config (num_layers={num_layers}, {fields})", hints=(GATES_HINT,))


#: a VSA-trained folder (``ditax export`` of an ``attention.sparsity=vsa`` run, which does not
#: record the sparsity) loaded dense: its gates are the only unexpected keys
GATES_HINT = (r"\.attn1\.to_gate_compress\.",
              "these are the self-attention gates of a VSA-trained model: load it with "
              "attention.sparsity=vsa attention.topk=K (the K it was trained with)")


def param_axes(cross_attn_norm: bool = True, image: bool = False, pos_embed: bool = False, *,
               head_dim: int) -> dict[tuple[str, ...], tuple]:
    """Our parameter path → logical axis names (the stacked blocks get a leading "layers")."""
    return logical_axes(table(cross_attn_norm, image, pos_embed, head_dim=head_dim)
                        + gate_rows())


def table_options(cfg) -> dict:
    """The keyword arguments of :func:`weight_table` / :func:`param_axes` after the layer
    count, for a :class:`~ditax.models.wan.config.ModelConfig`."""
    return dict(cross_attn_norm=cfg.cross_attn_norm, image=cfg.image_dim is not None,
                pos_embed=cfg.pos_embed_seq_len is not None, head_dim=cfg.attention_head_dim)


def config_weight_table(cfg, gated: bool = False) -> Table:
    """:func:`weight_table` for a model config (``gated``: with :func:`gate_rows`)."""
    table = weight_table(cfg.num_layers, **table_options(cfg))
    return table.extended(gate_rows()) if gated else table


def config_param_axes(cfg) -> dict[tuple[str, ...], tuple]:
    """:func:`param_axes` for a model config."""
    return param_axes(**table_options(cfg))


class Variant(Builder):
    """A Wan variant (VACE, Animate): its table is Wan's rows for its config, then
    ``rows(cfg)``'s; its builders (:class:`~ditax.models.common.loaded.Builder`) make
    ``module``; ``fields`` names the config fields beside ``num_layers`` that its rows depend on
    (in a mismatch message)."""

    def __init__(self, module: Callable, rows: Callable[[Any], list[Row]],
                 fields: tuple[str, ...]):
        super().__init__(module, self.config_param_axes)
        self.rows, self.fields = rows, fields

    def table(self, cfg) -> list[Row]:
        """All rows of a variant config (Wan's, then the variant's)."""
        return table(**table_options(cfg)) + self.rows(cfg)

    def config_weight_table(self, cfg) -> Table:
        """The variant transformer's :class:`~ditax.io.convert.Table`."""
        shown = {f: getattr(cfg, f) for f in self.fields}
        return _weight_table(self.table(cfg), cfg.num_layers, ", ".join(
            f"{f}={list(v) if isinstance(v, tuple) else v}" for f, v in shown.items()))

    def config_param_axes(self, cfg) -> dict[tuple[str, ...], tuple]:
        """Our parameter path → logical axes (stacked rows get a leading "layers")."""
        return logical_axes(self.table(cfg))

    def functions(self) -> tuple[Callable, ...]:
        """A variant module's functions: ``(table, config_weight_table, config_param_axes,
        param_shardings, abstract_model, init_model)``."""
        return (self.table, self.config_weight_table, self.config_param_axes,
                self.param_shardings, self.abstract_model, self.init_model)
