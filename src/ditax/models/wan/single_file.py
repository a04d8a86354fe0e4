"""Original Wan / ComfyUI transformer checkpoints: one ``.safetensors`` file, original key names.

``wan2.1_t2v_1.3B_bf16.safetensors`` and its kin hold the transformer under the original Wan
names (``blocks.0.self_attn.q.weight``, ``head.head.weight``, ``blocks.0.modulation`` …),
optionally prefixed ``diffusion_model.`` (ComfyUI) or ``model.diffusion_model.``, and no
``config.json``. :func:`original_table` renames the diffusers table's keys through
:mod:`ditax.models.wan.original_names`, so such a file is read with the same key and shape
checks (messages name the file's own keys) and the same sharded reads as a diffusers folder;
the architecture comes from ``config=`` (a preset name, a YAML path or a ``ModelConfig``).
"""

from __future__ import annotations

import dataclasses
import pathlib

from ditax.errors import ConfigError
from ditax.io.convert import Table
from ditax.models.wan.config import ModelConfig
from ditax.models.wan.original_names import key_to_original

PREFIXES = ("model.diffusion_model.", "diffusion_model.")


def is_single_file(path) -> bool:
    return pathlib.Path(path).is_file() and str(path).endswith(".safetensors")


def key_prefix(keys) -> str:
    """The prefix of the transformer's keys (``diffusion_model.`` …) or ``""``."""
    keys = list(keys)
    return next((p for p in PREFIXES if any(k.startswith(p) for k in keys)), "")


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


def single_file_config(path, config, **overrides) -> ModelConfig:
    """The architecture of a single-file checkpoint: ``config`` is a preset name, a YAML path or
    a :class:`ModelConfig`; ``overrides`` (dtypes, remat …) replace its fields."""
    if config is None:
        from ditax.config import preset_names

        raise ConfigError(f"{path} is a single-file checkpoint without config.json; pass its "
                          f"architecture as config= (a preset: {', '.join(preset_names())}; a "
                          f"YAML path; or a ditax ModelConfig)")
    if isinstance(config, (str, pathlib.Path)):
        from ditax.config import load_config

        config = load_config(str(config)).model
    if not isinstance(config, ModelConfig):
        raise ConfigError(f"config={config!r} is not a preset name, YAML path or ModelConfig")
    return dataclasses.replace(config, **overrides)

