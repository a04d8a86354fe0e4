"""Original Wan / ComfyUI transformer checkpoints: one ``.safetensors`` file, original key names.

``wan2.1_t2v_1.3B_bf16.safetensors`` and its kin hold the transformer under the original Wan
names (``blocks.0.self_attn.q.weight``, ``head.head.weight``, ``blocks.0.modulation`` …),
optionally prefixed ``diffusion_model.`` (ComfyUI) or ``model.diffusion_model.``, and no
``config.json``. :func:`original_table` renames the diffusers table's keys through
:mod:`ditax.models.wan.original_names`, so such a file is read with the same key and shape
checks (messages name the file's own keys) and the same sharded reads as a diffusers folder;
the architecture comes from ``config=``, a :class:`~ditax.models.wan.config.WanConfig` (preset
names and YAML paths are read into one above the models, by ``ditax.load_transformer`` and
``ditax convert``: models never read run configs).

:func:`write_diffusers_folder` (``ditax convert FILE --config NAME --out DIR``) turns such a file
into a diffusers ``transformer/`` folder: ``config.json`` plus safetensors shards (with an index
past one shard) under the diffusers names, tensor by tensor, after the same checks.
"""

from __future__ import annotations

import dataclasses
import pathlib

from ditax.io.convert import Table
from ditax.models.common.single_files import (SHARD_BYTES, check_out, file_sources, key_prefix,
                                              write_checked)
from ditax.models.common.single_files import single_file_config as shared_config
from ditax.models.wan.config import WanConfig
from ditax.models.wan.original_names import key_to_original


def is_original(keys) -> bool:
    """Whether a checkpoint's keys use the original Wan names (``head.head``, ``self_attn``)."""
    prefix = key_prefix(keys)
    return any(k[len(prefix):].startswith("head.head.") or ".self_attn." in k for k in keys)


def original_table(table: Table, prefix: str = "") -> Table:
    """``table`` (diffusers keys) with every key renamed to ``prefix`` + its original name."""
    rows = []
    for row in table.rows:
        orig = key_to_original(row.key)
        if orig is None:
            raise KeyError(f"{table.name}: no original Wan name for {row.key}")
        rows.append(dataclasses.replace(row, key=prefix + orig, alt=()))
    return dataclasses.replace(table, rows=tuple(rows))


def renamer(prefix: str):
    """Diffusers tensor key → the key in an original-format checkpoint with ``prefix``."""
    return lambda key: prefix + key_to_original(key)


def single_file_config(path, config, **overrides) -> WanConfig:
    """The architecture of a single-file checkpoint: ``config`` is a :class:`WanConfig`
    (the entry points read preset names and YAML paths into one first); ``overrides``
    (dtypes, remat …) replace its fields."""
    return shared_config(path, config, WanConfig, "Wan", "wan2.1-t2v-1.3b", **overrides)


def check_single_file(path, config):
    """Key and shape check of a single-file checkpoint against ``config`` from its headers
    alone (no tensor data); returns ``(WanConfig, Weights, {diffusers key: key in the file},
    the diffusers table, parameter shapes, renamer)``. Raises :class:`WeightError` as loading
    would."""
    from flax import nnx

    from ditax.io.convert import check_weights, param_shapes
    from ditax.io.weights import Weights
    from ditax.models.wan import convert
    from ditax.models.wan.build import abstract_model

    cfg = single_file_config(path, config)
    weights = Weights.open(path)
    table = convert.config_weight_table(cfg)
    read_table, rename = table, (lambda k: k)
    if is_original(weights.keys()):
        prefix = key_prefix(weights.keys())
        read_table, rename = original_table(table, prefix), renamer(prefix)
    shapes = param_shapes(nnx.state(abstract_model(cfg)))
    source = file_sources(table, read_table, check_weights(read_table, weights, shapes))
    return cfg, weights, source, table, shapes, rename


def write_diffusers_folder(path, config, out, *, dtype: str | None = None, loras=None,
                           lora_strict: bool = True, shard_bytes: int = SHARD_BYTES
                           ) -> pathlib.Path:
    """Write the single-file checkpoint ``path`` (original Wan / ComfyUI names, or diffusers
    names) as a diffusers transformer folder ``out`` that ``WanTransformer3DModel.from_pretrained``
    and ``ditax.load_transformer`` read; returns ``out``.

    ``config``: the architecture, as for :func:`single_file_config`. Keys and shapes are checked
    against it first (:func:`check_single_file`; nothing is written for a file that does not
    fit). ``dtype`` casts every tensor (default: each keeps its stored dtype); ``loras`` are
    merged in (fused) as each tensor is read. Tensors are read one at a time and written in
    shards of at most ``shard_bytes``, so memory stays near one shard. ``out`` (new or empty,
    its parent writable: checked first) is written as a hidden folder beside it and renamed
    when complete, so a failure leaves no half-written folder.
    """
    from ditax.models.wan.lora_names import LORA_NAMES

    out = check_out(out, dtype)
    cfg, weights, source, table, shapes, rename = check_single_file(path, config)
    return write_checked(out, cfg, weights, source, table, shapes, LORA_NAMES, dtype=dtype,
                         loras=loras, lora_strict=lora_strict, rename=rename,
                         shard_bytes=shard_bytes)
