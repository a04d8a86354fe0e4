"""Check a diffusers Wan transformer folder against the weights table without reading tensors.

Reads ``config.json`` and the safetensors headers only: every expected key is present, none is
unexpected, and every tensor has the shape the model built from that config expects (after the
table's transform). What ``ditax convert`` reports before a long load is attempted. The
architecture is the config's ``_class_name`` (Wan, VACE or Animate), as when loading.
"""

from __future__ import annotations

import dataclasses
import pathlib



@dataclasses.dataclass(frozen=True)
class FolderSummary:
    """What a folder that passed the check holds."""

    folder: pathlib.Path
    num_layers: int
    inner_dim: int            # D
    num_heads: int            # N
    head_dim: int             # K
    num_params: int
    num_tensors: int


def check_folder(path, subfolder: str = "transformer") -> FolderSummary:
    """Check the folder at ``path`` (transformer folder, pipeline folder or hub id).

    Raises :class:`~ditax.errors.ModelNotFound` for a missing folder and
    ``ditax.errors.WeightError`` listing missing / unexpected keys or every tensor whose
    shape does not fit the config.
    """
    import math

    from flax import nnx

    from ditax.io.convert import check_weights, param_shapes
    from ditax.io.hub import resolve_folder
    from ditax.io.weights import Weights
    from ditax.models.wan import animate, animate_convert, build, convert, vace, vace_convert
    from ditax.models.wan.config import WanConfig
    from ditax.models.wan.loading import read_config

    folder = resolve_folder(path, subfolder)
    raw = read_config(folder)
    # by _class_name, as load_transformer: (config class, its table and builder, its check)
    config_cls, tables, builder, check = {
        vace.VACE_CLASS: (vace.WanVaceConfig, vace_convert, vace_convert, vace.check_vace),
        animate.ANIMATE_CLASS: (animate.WanAnimateConfig, animate_convert, animate_convert,
                                animate.check_animate),
    }.get(raw.get("_class_name"), (WanConfig, convert, build, None))
    cfg = config_cls.from_diffusers(raw)
    if check is not None:
        check(cfg)
    weights = Weights.open(folder)
    # a VSA-trained folder (``attention.sparsity=vsa``: what ``ditax export`` writes of such a
    # run) carries its self-attention gates: checked as the gated model's optional rows
    gated = tables is convert and any(".attn1.to_gate_compress." in k for k in weights.keys())
    attention = None
    if gated:
        from ditax.attention.config import AttentionConfig

        attention = AttentionConfig(sparsity="vsa", topk=1)
    shapes = param_shapes(nnx.state(builder.abstract_model(cfg, attention)))
    table = tables.config_weight_table(cfg, gated) if gated else tables.config_weight_table(cfg)
    check_weights(table, weights, shapes)
    return FolderSummary(folder, cfg.num_layers, cfg.inner_dim, cfg.num_attention_heads,
                         cfg.attention_head_dim, sum(math.prod(s) for s in shapes.values()),
                         len(weights))
