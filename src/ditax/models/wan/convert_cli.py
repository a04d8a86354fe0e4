"""``ditax convert PATH``: check a diffusers Wan transformer folder against the key table.

Reads config.json and the safetensors headers (no tensor data), checks every key and every
tensor shape through the transformer's table (:mod:`ditax.io.convert`), and prints a summary.
A folder that does not fit raises :class:`~ditax.errors.WeightError` listing the missing /
unexpected keys or the mismatched shapes.
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser):
    p.add_argument("path", help="transformer folder, pipeline folder or hub id")
    p.add_argument("--subfolder", default="transformer")


def check_folder(path, subfolder: str | None = "transformer") -> str:
    """Check a transformer folder's weights against its config; a one-line summary if they fit."""
    import math

    from flax import nnx

    from ditax.config import ModelConfig
    from ditax.io.convert import check_weights, param_shapes
    from ditax.io.hub import resolve_folder
    from ditax.io.weights import Weights
    from ditax.models.wan import convert
    from ditax.models.wan.loading import abstract_model, read_config

    folder = resolve_folder(path, subfolder)
    cfg = ModelConfig.from_diffusers(read_config(folder))
    weights = Weights.open(folder)
    table = convert.weight_table(cfg.num_layers, cfg.cross_attn_norm)
    shapes = param_shapes(nnx.state(abstract_model(cfg)))
    check_weights(table, weights, shapes)
    n = sum(math.prod(s) for s in shapes.values())
    return (f"{folder}: OK — {cfg.num_layers} layers, D={cfg.inner_dim}, "
            f"{cfg.num_attention_heads} heads x {cfg.attention_head_dim}, {n / 1e9:.3f} B params, "
            f"{len(weights)} tensors")


def run(args) -> int:
    print(check_folder(args.path, args.subfolder))
    return 0
