"""``ditax convert PATH``: check a diffusers Wan transformer folder against the weights table.

Reads config.json and the safetensors headers (no tensor data) and prints a summary; exit 0
when the folder loads, 2 with one line naming the missing / unexpected keys or the tensors whose
shapes do not fit (:func:`ditax.models.wan.folder_check.check_folder`).
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser):
    p.add_argument("path", help="transformer folder, pipeline folder or hub id")
    p.add_argument("--subfolder", default="transformer")


def run(args) -> int:
    from ditax.models.wan.folder_check import check_folder

    s = check_folder(args.path, args.subfolder)
    print(f"{s.folder}: OK — {s.num_layers} layers, D={s.inner_dim}, {s.num_heads} heads x "
          f"{s.head_dim}, {s.num_params / 1e9:.3f} B params, {s.num_tensors} tensors")
    return 0
