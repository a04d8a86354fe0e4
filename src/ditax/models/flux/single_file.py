"""BFL's single-file FLUX.1 checkpoints (``flux1-dev.safetensors``) read as a diffusers folder.

Such a file holds the transformer under BFL's names (``img_in``, ``double_blocks.N.img_attn.qkv``
fused, ``single_blocks.N.linear1`` fused, ``final_layer.adaLN_modulation.1`` with its halves
swapped; :mod:`.original_names`), optionally prefixed ``model.diffusion_model.`` /
``diffusion_model.`` (ComfyUI), and no ``config.json``: the architecture comes from
``config=`` (a :class:`~ditax.models.flux.config.FluxConfig`; preset names and YAML paths are
read into one above the models, by ``ditax.load_transformer`` and ``ditax convert``).

:func:`write_diffusers_folder` (``ditax convert FILE --config NAME --out DIR``) writes such a
file as a diffusers folder. :func:`open_single_file` checks the file's keys and shapes against the config from the
headers alone — one :class:`~ditax.errors.WeightError` listing every missing, unexpected and
wrongly shaped key under the file's own names — and returns :class:`BflWeights`, a view that
shows the file under the diffusers keys of :mod:`.convert`'s table: a fused layer's member is
a row range of the stored tensor, read slice by slice, so the loader (strict checks, sharded
reads, merged LoRAs) is the folders' own.
"""

from __future__ import annotations

import numpy as np

from ditax.io.convert import key_mismatch, param_shapes
from ditax.lora.merge import upstream_shapes
from ditax.models.flux.config import FluxConfig
from ditax.models.flux.original_names import fused, tensor_key
from ditax.models.common.fused_rows import FusedRowsView as BflWeights
from ditax.models.common.fused_rows import mismatch, plan_rows
from ditax.models.common.single_files import SHARD_BYTES, check_out, key_prefix, write_checked
from ditax.models.common.single_files import single_file_config as shared_config

def is_bfl(keys) -> bool:
    """Whether a checkpoint's keys use BFL's names (``double_blocks.`` / ``img_in.``)."""
    prefix = key_prefix(keys)
    return any(k[len(prefix):].startswith(("double_blocks.", "img_in.")) for k in keys)


def single_file_config(path, config, **overrides) -> FluxConfig:
    """The architecture of a single-file checkpoint: ``config`` is a :class:`FluxConfig`
    (the entry points read preset names and YAML paths into one first); ``overrides``
    (dtypes, remat …) replace its fields."""
    return shared_config(path, config, FluxConfig, "Flux", "flux.1-dev", **overrides)


def open_single_file(path, cfg: FluxConfig, table, shapes: dict):
    """The file at ``path`` as :class:`BflWeights` (diffusers keys of ``table``, our
    parameter ``shapes``), or the file itself when it already has diffusers keys; raises one
    :class:`~ditax.errors.WeightError` naming every missing, unexpected and wrongly shaped stored key."""
    from ditax.io.weights import Weights

    weights = Weights.open(path)
    if not is_bfl(weights.keys()):
        return weights
    prefix = key_prefix(weights.keys())
    sources, stored = plan_rows(upstream_shapes(table, shapes), prefix, tensor_key, fused)
    missing, unexpected, bad = mismatch(weights, stored)
    if missing or unexpected or bad:
        raise key_mismatch(
            f"transformer weights in {path} (BFL names) do not match {table.context}",
            missing, unexpected, "check config= (a FLUX.1 preset: flux.1-dev has the guidance "
            "embedding, flux.1-schnell not) and that the file downloaded completely", bad)
    return BflWeights(weights, sources)


def _checked(path, config):
    """(config, weights keyed by diffusers names, table, parameter shapes) of ``path`` after
    the key and shape checks (headers only)."""
    from flax import nnx

    from ditax.io.convert import check_weights
    from ditax.models.flux.build import abstract_model
    from ditax.models.flux.convert import weight_table

    cfg = single_file_config(path, config)
    table = weight_table(cfg)
    shapes = param_shapes(nnx.state(abstract_model(cfg)))
    weights = open_single_file(path, cfg, table, shapes)
    if not isinstance(weights, BflWeights):
        check_weights(table, weights, shapes)
    return cfg, weights, table, shapes


def check_single_file(path, config) -> str:
    """Key and shape check of a single-file checkpoint against ``config`` from its headers
    alone (``ditax convert FILE --config NAME``); returns a one-line summary."""
    cfg, weights, _, shapes = _checked(path, config)
    n = sum(int(np.prod(s)) for s in shapes.values())
    return (f"{path}: OK — {cfg.num_layers} double + {cfg.num_single_layers} single blocks, "
            f"D={cfg.inner_dim}, {n / 1e9:.3f} B params, {len(weights)} tensors")


def write_diffusers_folder(path, config, out, *, dtype: str | None = None, loras=None,
                           lora_strict: bool = True, shard_bytes: int = SHARD_BYTES):
    """Write the single-file checkpoint ``path`` (BFL's names or diffusers') as a diffusers
    ``FluxTransformer2DModel`` folder ``out`` (``ditax convert FILE --config NAME --out DIR``),
    after the same checks as loading; ``dtype`` casts every tensor, ``loras`` are fused in as
    each tensor is read (:func:`ditax.models.common.single_files.write_folder` for the rest)."""
    from ditax.models.flux.lora_names import LORA_NAMES

    out = check_out(out, dtype)
    cfg, weights, table, shapes = _checked(path, config)
    return write_checked(out, cfg, weights, {k: k for k in table.expected_keys()}, table,
                         shapes, LORA_NAMES, dtype=dtype, loras=loras, lora_strict=lora_strict,
                         shard_bytes=shard_bytes)


__all__ = ["BflWeights", "check_single_file", "is_bfl", "key_prefix", "open_single_file",
           "single_file_config", "write_diffusers_folder"]
