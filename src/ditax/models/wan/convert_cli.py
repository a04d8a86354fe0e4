"""``ditax convert PATH``: check a diffusers Wan transformer folder against the key table.

Reads config.json and the safetensors headers (no tensor data), reports missing / unexpected
keys and shape mismatches, and prints a summary. Exit code 0 when the folder loads.
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser):
    p.add_argument("path", help="transformer folder, pipeline folder or hub id")
    p.add_argument("--subfolder", default="transformer")


def run(args) -> int:
    import numpy as np

    from ditax.config import ModelConfig
    from ditax.io.hub import resolve_folder
    from ditax.io.safetensors import SafetensorsCheckpoint
    from ditax.models.wan import convert
    from ditax.models.wan.loading import abstract_model, read_config

    folder = resolve_folder(args.path, args.subfolder)
    cfg = ModelConfig.from_diffusers(read_config(folder))
    ckpt = SafetensorsCheckpoint(folder)
    convert.check_keys(ckpt.keys(), cfg.num_layers, cfg.cross_attn_norm)
    from flax import nnx
    import jax

    state = nnx.state(abstract_model(cfg))
    want = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        want[tuple(str(getattr(k, "key", k)) for k in path[:-1])] = tuple(leaf.shape)
    bad = []
    for row in convert.table(cfg.cross_attn_norm):
        shp = want[row.path]
        keys = [row.key.format(i=i) for i in range(cfg.num_layers)] if convert.is_stacked(row) \
            else [row.key]
        for k in keys:
            got = ckpt.shape(k)
            exp = shp[1:] if convert.is_stacked(row) else shp
            conv = convert.apply_transform(np.broadcast_to(np.zeros((), np.uint8), got),
                                           row.transform).shape
            if conv != exp:
                bad.append(f"{k}: {got} -> {conv}, expected {exp}")
    if bad:
        print("shape mismatches:\n  " + "\n  ".join(bad))
        return 1
    n = sum(int(np.prod(s)) for s in want.values())
    print(f"{folder}: OK — {cfg.num_layers} layers, D={cfg.inner_dim}, "
          f"{cfg.num_attention_heads} heads x {cfg.attention_head_dim}, {n / 1e9:.3f} B params, "
          f"{len(ckpt.keys())} tensors")
    return 0
