"""Check a diffusers Wan transformer folder against the weights table without reading tensors.

Reads ``config.json`` and the safetensors headers only: every expected key is present, none is
unexpected, and every tensor has the shape the model built from that config expects (after the
table's transform). What ``ditax convert`` reports before a long load is attempted.
"""

from __future__ import annotations

import dataclasses
import pathlib

import numpy as np

from ditax.errors import WeightError


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
    :class:`~ditax.errors.WeightError` listing missing / unexpected keys or every tensor whose
    shape does not fit the config.
    """
    import jax
    from flax import nnx

    from ditax.io.hub import resolve_folder
    from ditax.io.safetensors import SafetensorsCheckpoint
    from ditax.models.wan import convert
    from ditax.models.wan.config import ModelConfig
    from ditax.models.wan.loading import abstract_model, read_config

    folder = resolve_folder(path, subfolder)
    cfg = ModelConfig.from_diffusers(read_config(folder))
    ckpt = SafetensorsCheckpoint(folder)
    convert.check_keys(ckpt.keys(), cfg.num_layers, cfg.cross_attn_norm)
    want = {tuple(str(getattr(k, "key", k)) for k in p[:-1]): tuple(leaf.shape)
            for p, leaf in jax.tree_util.tree_flatten_with_path(
                nnx.state(abstract_model(cfg)))[0]}
    bad = []
    for row in convert.table(cfg.cross_attn_norm):
        stacked = convert.is_stacked(row)
        exp = want[row.path][1:] if stacked else want[row.path]
        for k in [row.key.format(i=i) for i in range(cfg.num_layers)] if stacked else [row.key]:
            got = ckpt.shape(k)
            conv = convert.apply_transform(np.broadcast_to(np.zeros((), np.uint8), got),
                                           row.transform).shape
            if conv != exp:
                bad.append(f"{k}: {got} -> {conv}, expected {exp}")
    if bad:
        raise WeightError(f"{folder}: {len(bad)} tensor(s) do not fit config.json: "
                          + "; ".join(bad) + "; check that config.json belongs to these weights")
    return FolderSummary(folder, cfg.num_layers, cfg.inner_dim, cfg.num_attention_heads,
                         cfg.attention_head_dim, sum(int(np.prod(s)) for s in want.values()),
                         len(ckpt.keys()))
