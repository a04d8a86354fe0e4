"""Original (Lightricks) LTX-2 checkpoints: one ``.safetensors`` file, the whole model in it.

``ltx-2-19b-dev.safetensors`` and its kin hold the transformer under ``model.diffusion_model.``
with the original names (:mod:`ditax.models.ltx2.transformer.original_names`), and beside it the
text connectors (under the same prefix), the video VAE (``vae.``), the audio VAE (``audio_vae.``)
and the vocoder (``vocoder.``); no ``config.json``. ditax reads only the transformer from such
a file: the other parts are known and skipped (a table's ``ignore``), any other key is refused
as unexpected, and a missing transformer key is named — one
:class:`~ditax.errors.WeightError` line, from the headers alone, before any tensor is read.
The rest of a pipeline (connectors, VAEs, vocoder) comes from a diffusers ``LTX2Pipeline``
folder. A file with the transformer alone, with or without the prefix, under the original
names or diffusers', reads the same way.

:func:`file_table` renames the diffusers table's keys to the file's (prefix + original name),
so the file is read with the loader's own key and shape checks and sharded reads; the
architecture comes from ``config=``, an :class:`~ditax.models.ltx2.config.LTX2Config` (the
``ltx-2`` / ``ltx-2.3`` presets; preset names and YAML paths are read into one above the
models). :func:`write_diffusers_folder` (``ditax convert FILE --config ltx-2 --out DIR``)
writes the transformer as a diffusers ``transformer/`` folder, after the same checks.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import re
from typing import Callable

from ditax.io.convert import Table
from ditax.models.common.single_files import (SHARD_BYTES, check_out, file_sources, key_prefix,
                                              write_checked)
from ditax.models.common.single_files import single_file_config as shared_config
from ditax.models.ltx2.config import LTX2Config
from ditax.models.ltx2.transformer.original_names import (CONNECTOR_PARTS, OTHER_PARTS, PREFIXES,
                                                          is_original, key_to_original)


def single_file_config(path, config, **overrides) -> LTX2Config:
    """The architecture of a single-file checkpoint: ``config`` is an :class:`LTX2Config`
    (the entry points read preset names and YAML paths into one first); ``overrides``
    (dtypes, remat, quantize …) replace its fields."""
    return shared_config(path, config, LTX2Config, "LTX-2", "ltx-2", **overrides)


def file_table(table: Table, keys) -> tuple[Table, Callable]:
    """``table`` (diffusers keys) as the file with ``keys`` names them — the transformer's
    prefix, original names where the file has them — with the file's other parts ignored;
    and the renamer of a diffusers key to the file's (for merging LoRAs)."""
    keys = list(keys)
    prefix = key_prefix(keys, PREFIXES)
    name = key_to_original if is_original(keys, prefix) else str
    rename = lambda key: prefix + name(key)  # noqa: E731
    rows = tuple(dataclasses.replace(r, key=rename(r.key), alt=()) for r in table.rows)
    ignore = (rf"^{re.escape(prefix)}({'|'.join(CONNECTOR_PARTS)})\.",
              rf"^({'|'.join(OTHER_PARTS)})\.")
    return dataclasses.replace(table, rows=rows, ignore=table.ignore + ignore), rename


def open_single_file(path, table: Table):
    """``(weights, the table to read them with, renamer)`` of the file at ``path``
    (:func:`file_table`); the loader's ``open_weights`` for single files. Raises one
    :class:`~ditax.errors.WeightError` line naming every missing and unexpected key (the
    file's own names) with the single file's fix, from the headers alone."""
    from ditax.io.convert import key_mismatch
    from ditax.io.weights import Weights

    weights = Weights.open(path)
    read_table, rename = file_table(table, weights.keys())
    have, want = set(weights.keys()), read_table.expected_keys()
    skipped = [re.compile(p) for p in read_table.ignore]
    missing = [k for k in want if k not in have]
    unexpected = sorted(k for k in have.difference(want) if not any(p.search(k) for p in skipped))
    if missing or unexpected:
        raise key_mismatch(f"LTX-2 transformer weights in {path} do not match {table.context}",
                           missing, unexpected, "check config= (the ltx-2 or ltx-2.3 preset, "
                           "or a YAML of the model's architecture) and that the file "
                           "downloaded completely")
    return weights, read_table, rename


def open_weights(source, cfg, table, shapes):
    """The loader's ``open_weights``: a diffusers folder as stored; one file through the
    table renamed to its keys (:func:`open_single_file`), its other parts (VAEs, vocoder,
    connectors) skipped."""
    from ditax.io.weights import is_single_file
    from ditax.models.common.loader import plain_weights

    if not is_single_file(source):
        return plain_weights(source, cfg, table, shapes)
    return open_single_file(source, table)


def check_single_file(path, config):
    """Key and shape check of a single-file checkpoint against ``config`` from its headers
    alone; returns ``(LTX2Config, Weights, {diffusers key: key in the file}, the diffusers
    table, parameter shapes, renamer)``. Raises :class:`~ditax.errors.WeightError` as
    loading would (one line naming every missing, unexpected and wrongly shaped key)."""
    from flax import nnx

    from ditax.io.convert import check_weights, param_shapes
    from ditax.models.ltx2.transformer.build import abstract_model
    from ditax.models.ltx2.transformer.convert import weight_table

    cfg = single_file_config(path, config)
    table = weight_table(cfg)
    weights, read_table, rename = open_single_file(path, table)
    shapes = param_shapes(nnx.state(abstract_model(cfg)))
    source = file_sources(table, read_table, check_weights(read_table, weights, shapes))
    return cfg, weights, source, table, shapes, rename


def summary(path, config) -> str:
    """``ditax convert FILE --config NAME``'s line: the checks passed, the model's size and
    how many of the file's tensors are the transformer's."""
    cfg, weights, source, _, shapes, _ = check_single_file(path, config)
    n = sum(math.prod(s) for s in shapes.values())
    return (f"{path}: OK — {cfg.num_layers} blocks, video D={cfg.inner_dim} "
            f"({cfg.num_attention_heads} heads x {cfg.attention_head_dim}), audio "
            f"Da={cfg.audio_inner_dim}, {n / 1e9:.3f} B params, {len(source)} transformer "
            f"tensors of the file's {len(weights)} (ditax reads the transformer only)")


def write_diffusers_folder(path, config, out, *, dtype: str | None = None, loras=None,
                           lora_strict: bool = True, shard_bytes: int = SHARD_BYTES
                           ) -> pathlib.Path:
    """Write the transformer of the single-file checkpoint ``path`` (original names or
    diffusers') as a diffusers ``LTX2VideoTransformer3DModel`` folder ``out`` that
    ``ditax.load_transformer`` and diffusers' ``from_pretrained`` read; returns ``out``.

    Keys and shapes are checked against ``config`` first (:func:`check_single_file`: nothing
    is written for a file that does not fit); ``dtype`` casts every tensor (None: each keeps
    its stored dtype); ``loras`` are merged in as each tensor is read. Tensors are read one
    shard at a time (:func:`ditax.models.common.single_files.write_folder`)."""
    from ditax.models.ltx2.lora_names import LORA_NAMES

    out = check_out(out, dtype)
    cfg, weights, source, table, shapes, rename = check_single_file(path, config)
    return write_checked(out, cfg, weights, source, table, shapes, LORA_NAMES, dtype=dtype,
                         loras=loras, lora_strict=lora_strict, rename=rename,
                         shard_bytes=shard_bytes)


__all__ = ["check_single_file", "file_table", "open_single_file", "open_weights",
           "single_file_config",
           "summary", "write_diffusers_folder"]
