"""What every family's single-file checkpoints share (a floor): key prefixes, ``config=``, and
writing one as a diffusers transformer folder (``ditax convert FILE --config NAME --out DIR``).

Original / ComfyUI single files (Wan's ``wan2.1_t2v_1.3B_bf16.safetensors``, BFL's
``flux1-dev.safetensors``) hold one transformer, optionally under ``model.diffusion_model.`` or
``diffusion_model.``, and no ``config.json``: the architecture comes from ``config=``, the
family's model config (preset names and YAML paths are read into one above the models).
"""

from __future__ import annotations

import dataclasses
import pathlib

from ditax.errors import ConfigError
from ditax.models.common.fields import DTYPES, check_overrides

PREFIXES = ("model.diffusion_model.", "diffusion_model.")
WEIGHTS_NAME = "diffusion_pytorch_model"
SHARD_BYTES = 5 * 2**30   # diffusers' own default shard size is of this order


def key_prefix(keys, prefixes=PREFIXES) -> str:
    """The prefix of the transformer's keys (``diffusion_model.`` …) or ``""``."""
    keys = list(keys)
    return next((p for p in prefixes if any(k.startswith(p) for k in keys)), "")


def single_file_config(path, config, cls, family: str, preset: str, **overrides):
    """The architecture of the single-file checkpoint ``path``: ``config`` must be a ``cls``
    (the family's model config, e.g. from the preset ``preset``); ``overrides`` (dtypes,
    remat …) replace its fields."""
    if config is None:
        raise ConfigError(f"{path} is a single-file checkpoint without config.json; pass its "
                          f"architecture as config= (--config on the command line; a preset "
                          f"such as {preset}; a YAML path; or a ditax {cls.__name__})")
    if not isinstance(config, cls):
        raise ConfigError(f"config={config!r} is not a {family} model config ({cls.__name__}); "
                          f"preset names and YAML paths are read by ditax.load_transformer")
    check_overrides(cls, overrides)
    return dataclasses.replace(config, **overrides)


def check_out(out, dtype: str | None) -> pathlib.Path:
    """``--out`` must be a new or empty folder with a writable parent, ``dtype`` (the cast of
    every tensor, None: stored dtypes) a known one; checked before anything is read."""
    from ditax.io.outputs import check_writable_parent

    out = pathlib.Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--out {out} exists and is not an empty folder; pass a new folder "
                          f"(nothing is overwritten)")
    check_writable_parent(out, "--out", error=ConfigError)
    if dtype is not None and dtype not in DTYPES:
        raise ConfigError(f"dtype={dtype!r} is not one of {', '.join(DTYPES)}")
    return out


def _shards(sizes: list[tuple[str, int]], limit: int) -> list[list[str]]:
    """Keys in order, cut into runs of at most ``limit`` bytes (a bigger tensor alone)."""
    out, run, used = [], [], 0
    for key, n in sizes:
        if run and used + n > limit:
            out.append(run)
            run, used = [], 0
        run.append(key)
        used += n
    return out + ([run] if run else [])


def file_sources(table, read_table, chosen: dict) -> dict[str, str]:
    """``{diffusers key: the key in the file}`` of a single file read through ``read_table``
    (row for row ``table`` under the file's names), ``chosen``: the keys
    :func:`ditax.io.convert.check_weights` picked (a row's alternative spellings)."""
    source = {}
    for ours, theirs in zip(table.rows, read_table.rows):
        source.update({d: chosen[o] for d, o in zip(table.names(ours), read_table.names(theirs))})
    return source


def write_checked(out, cfg, weights, source: dict[str, str], table, shapes: dict, names, *,
                  dtype: str | None = None, loras=None, lora_strict: bool = True,
                  rename=None, shard_bytes: int = SHARD_BYTES) -> pathlib.Path:
    """``ditax convert FILE --out DIR``'s last step for a file the family has checked: its
    ``loras`` (the family's LoRA ``names``) merged into ``weights`` as each tensor is read
    (``rename``: diffusers key → the file's), then :func:`write_folder` with ``cfg``'s
    diffusers ``config.json``. ``out`` has passed :func:`check_out`."""
    if loras:
        from ditax.lora import merged_weights

        weights = merged_weights(weights, loras, table, shapes, names=names,
                                 strict=lora_strict, rename=rename)
    return write_folder(out, weights, source, cfg.to_diffusers(), dtype, shard_bytes)


def write_folder(out, weights, source: dict[str, str], config: dict, dtype: str | None = None,
                 shard_bytes: int = SHARD_BYTES) -> pathlib.Path:
    """Write ``weights`` (checked already; ``source``: diffusers key → the key ``weights``
    holds) as a diffusers folder ``out`` (:func:`check_out` first): ``config.json`` =
    ``config``, safetensors shards of at most ``shard_bytes`` (an index past one), every tensor
    cast to ``dtype`` (None: its stored dtype). Tensors are read one shard at a time, so memory
    stays near one shard; the folder is written hidden beside ``out`` and renamed when
    complete, so a failure leaves no half-written folder."""
    import json

    import numpy as np
    from safetensors.numpy import save_file

    from ditax.io.outputs import atomic_folder
    from ditax.io.weights import INDEX_SUFFIX

    out = pathlib.Path(out)

    def out_dtype(key):
        return np.dtype(dtype) if dtype else weights.dtype(source[key])

    sizes = [(k, out_dtype(k).itemsize * int(np.prod(weights.shape(source[k]), dtype=np.int64)))
             for k in source]
    runs = _shards(sizes, shard_bytes)
    names = ([f"{WEIGHTS_NAME}.safetensors"] if len(runs) == 1 else
             [f"{WEIGHTS_NAME}-{i + 1:05d}-of-{len(runs):05d}.safetensors"
              for i in range(len(runs))])
    weight_map = {}
    with atomic_folder(out) as tmp:
        for name, run in zip(names, runs):
            tensors = {k: np.ascontiguousarray(np.asarray(weights.get(source[k]))
                                               .astype(out_dtype(k))) for k in run}
            save_file(tensors, str(tmp / name), metadata={"format": "pt"})
            weight_map.update({k: name for k in run})
            del tensors
        if len(runs) > 1:
            (tmp / (WEIGHTS_NAME + INDEX_SUFFIX)).write_text(json.dumps(
                {"metadata": {"total_size": sum(n for _, n in sizes)}, "weight_map": weight_map},
                indent=2))
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
    return out


__all__ = ["PREFIXES", "SHARD_BYTES", "WEIGHTS_NAME", "check_out", "file_sources", "key_prefix",
           "single_file_config", "write_checked", "write_folder"]
