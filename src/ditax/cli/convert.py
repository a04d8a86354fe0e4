"""``ditax convert``: check a diffusers Wan transformer folder, or turn a single-file original
Wan / ComfyUI checkpoint into one.

    ditax convert FOLDER                      # check: config.json against the safetensors headers
    ditax convert wan2.1_t2v_1.3B_bf16.safetensors --config wan2.1-t2v-1.3b --out Wan-1.3B/transformer
        [--dtype bfloat16] [--lora FILE[:STRENGTH] ...]

A folder is checked from its config.json and the safetensors headers (no tensor data): exit 0
with a summary when it loads, 2 with one line naming the missing / unexpected keys or the
tensors whose shapes do not fit (:func:`ditax.models.wan.folder_check.check_folder`). A single
file needs its architecture (``--config``: a preset or YAML); with ``--out`` it is written as a
diffusers folder (:func:`ditax.models.wan.single_file.write_diffusers_folder`, LoRAs fused in
with ``--lora``), which is then checked the same way; without ``--out`` it is only checked.
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser):
    p.add_argument("path", help="transformer folder, pipeline folder, hub id, or one "
                                ".safetensors file with original Wan / ComfyUI names")
    p.add_argument("--subfolder", default="transformer")
    p.add_argument("--config", default=None,
                   help="architecture of a single-file checkpoint: a preset (wan2.1-t2v-1.3b, "
                        "wan2.1-t2v-14b, ...) or a YAML path")
    p.add_argument("--out", default=None,
                   help="write the single-file checkpoint here as a diffusers transformer folder")
    p.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "float16"),
                   help="cast the written tensors (default: as stored)")
    p.add_argument("--lora", action="append", default=[], metavar="FILE[:STRENGTH]",
                   help="LoRA fused into the written weights (repeatable; --out only)")


def _summary(s) -> str:
    return (f"{s.folder}: OK — {s.num_layers} layers, D={s.inner_dim}, {s.num_heads} heads x "
            f"{s.head_dim}, {s.num_params / 1e9:.3f} B params, {s.num_tensors} tensors")


def run(args) -> int:
    from ditax.errors import ConfigError
    from ditax.models.wan.folder_check import check_folder
    from ditax.models.wan.single_file import is_single_file

    single = is_single_file(args.path)
    if not single:
        for flag, value in (("--config", args.config), ("--out", args.out),
                            ("--dtype", args.dtype), ("--lora", args.lora)):
            if value:
                raise ConfigError(f"{flag} is for single-file checkpoints (one .safetensors "
                                  f"file); {args.path} is read as a diffusers folder with its "
                                  f"own config.json")
        print(_summary(check_folder(args.path, args.subfolder)))
        return 0
    if args.out is None:
        if args.lora or args.dtype:
            raise ConfigError("--lora and --dtype change what --out writes; pass --out FOLDER")
        from ditax.models.wan.single_file import check_single_file

        c, weights = check_single_file(args.path, args.config)[:2]
        print(f"{args.path}: OK — {c.num_layers} layers, D={c.inner_dim}, "
              f"{c.num_attention_heads} heads x {c.attention_head_dim}, {len(weights)} tensors; "
              f"--out FOLDER writes it as a diffusers folder")
        return 0
    from ditax.lora import parse_lora_arg, resolve_loras
    from ditax.models.wan.single_file import write_diffusers_folder

    loras = resolve_loras([parse_lora_arg(s) for s in args.lora])
    folder = write_diffusers_folder(args.path, args.config, args.out, dtype=args.dtype,
                                    loras=loras)
    print(f"wrote {folder}")
    print(_summary(check_folder(folder, None)))
    return 0
