"""``ditax convert``: check a diffusers Wan transformer folder, or turn a single-file original
Wan / ComfyUI checkpoint into one.

    ditax convert FOLDER                      # check: config.json against the safetensors headers
    ditax convert wan2.1_t2v_1.3B_bf16.safetensors --config wan2.1-t2v-1.3b --out Wan-1.3B/transformer
        [--dtype bfloat16] [--lora FILE[:STRENGTH] ...]
    ditax convert FOLDER_OR_FILE [--config NAME] --quantize int8|fp8 --out DIR  # 8-bit folder

Everything goes through the model family (:mod:`ditax.models.registry`): a folder's by its
``config.json`` ``_class_name``, a single file's by the ``family`` of its ``--config``. A folder
is checked from its config.json and the safetensors headers (no tensor data): exit 0 with a
summary when it loads, 2 with one line naming the missing / unexpected keys or the tensors whose
shapes do not fit (:meth:`~ditax.models.base.ModelFamily.check_folder`). A single file needs its
architecture (``--config``: a preset or YAML); with ``--out`` it is written as a diffusers folder
(:meth:`~ditax.models.base.ModelFamily.convert_single_file`, LoRAs fused in with ``--lora``),
which is then checked the same way; without ``--out`` it is only checked.

``--quantize int8|fp8`` (a folder or a single file, ``--out`` required) loads the transformer
with its block linears quantized as ``ditax.load_transformer(..., quantize=)`` does (LoRAs
merged first) and writes ditax's 8-bit folder (:mod:`ditax.nn.quant_folder`: 8-bit weights +
a float32 ``weight_scale`` per output row; the other tensors in ``--dtype``, default float32),
which ``load_transformer(DIR, quantize=MODE)`` reads back bit-equal, without quantizing again.
"""

from __future__ import annotations

import argparse
import pathlib


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
    p.add_argument("--quantize", default=None, choices=("int8", "fp8"),
                   help="write --out as ditax's 8-bit folder: block linears in int8 / fp8 with "
                        "per-output-channel scales (load it with quantize=MODE)")


def folder_family(path, subfolder):
    """The family of the transformer folder at ``path`` (its ``config.json`` ``_class_name``;
    none: the default family) and the resolved folder."""
    from ditax.io.files import read_model_json
    from ditax.io.hub import resolve_folder
    from ditax.models import registry
    from ditax.models.base import family_class

    folder = resolve_folder(path, subfolder)
    cls = read_model_json(folder / "config.json", "transformer config").get("_class_name")
    name = registry.DEFAULT_FAMILY if cls is None else registry.spec_for_class(cls).name
    return family_class(name), folder


def require(family: str, capability: str, args, lora: bool = True) -> None:
    """What ``ditax convert`` asks of ``family`` before any work, each undeclared capability
    one line (:func:`ditax.models.registry.require`): ``capability``; the folder check of
    what it writes (``--out``); LoRA names for ``--lora`` (``lora``)."""
    from ditax.models import registry

    what = f"ditax convert {args.path}"
    registry.require(family, capability, what, "convert a model of a family that has it, or "
                     "load it with that family's own tools")
    if args.out is not None:
        registry.require(family, "folder_check", f"{what} --out {args.out}",
                         "convert a model of a family that can check what is written")
    if lora and args.lora:
        registry.require(family, "lora", f"{what} --lora {args.lora[0]}", "drop --lora")


def run(args) -> int:
    from ditax.errors import ConfigError
    from ditax.io.weights import is_single_file
    from ditax.load import model_config

    single = is_single_file(args.path)
    run_dir = pathlib.Path(args.path)      # a training run: ditax export is the command
    if (not single and (run_dir / "config.yaml").is_file()
            and not (run_dir / "config.json").is_file()):
        raise ConfigError(f"{args.path} is a training run folder (config.yaml), not a "
                          f"transformer folder; ditax export {args.path} --out FOLDER writes "
                          f"its checkpoint as a diffusers pipeline folder")
    if args.quantize:
        return write_quantized(args, single)
    if not single:
        for flag, value in (("--config", args.config), ("--out", args.out),
                            ("--dtype", args.dtype), ("--lora", args.lora)):
            if value:
                raise ConfigError(f"{flag} is for single-file checkpoints (one .safetensors "
                                  f"file); {args.path} is read as a diffusers folder with its "
                                  f"own config.json")
        family, folder = folder_family(args.path, args.subfolder)
        require(family.name, "folder_check", args, lora=False)
        print(family.check_folder(folder, None))
        return 0
    from ditax.models.base import model_family

    if args.out is None:
        if args.lora or args.dtype:
            raise ConfigError("--lora and --dtype change what --out writes; pass --out FOLDER")
        family = model_family(model_config(args.config, args.path))
        require(family.name, "single_file", args, lora=False)
        print(f"{family.check_single_file(args.path)}; --out FOLDER writes it as a diffusers "
              f"folder")
        return 0
    from ditax.lora import parse_lora_arg, resolve_loras

    family = model_family(model_config(args.config, args.path))
    require(family.name, "single_file", args)
    loras = resolve_loras([parse_lora_arg(s) for s in args.lora], names=family.lora_names())
    folder = family.convert_single_file(args.path, args.out, dtype=args.dtype, loras=loras)
    print(f"wrote {folder}")
    print(type(family).check_folder(folder, None))
    return 0


def write_quantized(args, single: bool) -> int:
    """``--quantize``: load with 8-bit block linears, write ditax's 8-bit folder, check it."""
    import ditax
    from ditax.errors import ConfigError
    from ditax.load import model_config
    from ditax.lora import parse_lora_arg
    from ditax.models import registry
    from ditax.models.base import model_family
    from ditax.models.common.single_files import check_out, write_folder
    from ditax.nn.quant_folder import QuantizedTensors, folder_config

    if args.out is None:
        raise ConfigError(f"--quantize {args.quantize} writes a folder; pass --out FOLDER")
    if not single and args.config:
        raise ConfigError(f"--config is for single-file checkpoints (one .safetensors file); "
                          f"{args.path} is read as a diffusers folder with its own config.json")
    out = check_out(args.out, args.dtype)
    family = (getattr(model_config(args.config, args.path), "family", None) if single else
              folder_family(args.path, args.subfolder)[0].name)
    require(family or registry.DEFAULT_FAMILY, "quantize", args)
    where = dict(config=args.config) if single else dict(subfolder=args.subfolder)
    tr = ditax.load_transformer(args.path, dtype=args.dtype or "float32",
                                quantize=args.quantize,
                                loras=[parse_lora_arg(s) for s in args.lora] or None, **where)
    family = model_family(tr.config)
    tensors = QuantizedTensors(tr.module, family.weight_table())
    folder = write_folder(out, tensors, {k: k for k in tensors.keys()},
                          folder_config(tr.config.to_diffusers(), args.quantize))
    print(f"wrote {folder} ({args.quantize} block linears + per-channel scales; load it with "
          f"quantize={args.quantize!r})")
    print(type(family).check_folder(folder, None))
    return 0
