"""BFL's single-file FLUX.2 checkpoints (``flux2-dev.safetensors``, ``flux-2-klein-4b.safetensors``)
read as a diffusers folder.

Such a file holds the transformer under BFL's names (:mod:`.original_names`, the map of
diffusers' ``convert_flux2_transformer_checkpoint_to_diffusers``): ``img_in``,
``double_blocks.N.img_attn.qkv`` / ``txt_attn.qkv`` fused (q, k, v stacked along the output:
diffusers' ``to_q``, ``to_k``, ``to_v`` / ``add_*_proj``), ``single_blocks.N.linear1`` (the
parallel block's input, the same tensor as diffusers' ``attn.to_qkv_mlp_proj``: q, k, v, then
the SwiGLU gate and value), ``final_layer.adaLN_modulation.1`` with its halves swapped (BFL's
shift, scale; diffusers' scale, shift), RMSNorm gains as ``.scale``; optionally under
``model.diffusion_model.`` / ``diffusion_model.`` (ComfyUI). There is no ``config.json``: the
architecture comes from ``config=``, a :class:`~ditax.models.flux2.config.Flux2Config` (the
``flux.2-dev`` / ``flux.2-klein-4b`` / ``flux.2-klein-9b`` presets or a YAML; names and paths
are read into one above the models). A file under diffusers' own names reads too.

:func:`open_single_file` checks the file's keys and shapes against the config from the headers
alone — one :class:`~ditax.errors.WeightError` line naming every missing, unexpected and
wrongly shaped key under the file's own names, with the fix — and returns :class:`BflWeights`,
the file shown under the diffusers keys of :mod:`.convert`'s table: a fused layer's member is a
row range of the stored tensor, read slice by slice, so the loader's strict checks, sharded
reads, merged LoRAs and 8-bit quantization are the folders' own (:data:`LOADER`).
:func:`write_diffusers_folder` (``ditax convert FILE --config NAME --out DIR``) writes the file
as a diffusers ``Flux2Transformer2DModel`` folder after the same checks.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ditax.io.convert import key_mismatch, param_shapes
from ditax.io.weights import Weights, is_single_file
from ditax.lora.merge import upstream_shapes
from ditax.models.common.loader import plain_weights
from ditax.models.common.fused_rows import FusedRowsView as BflWeights
from ditax.models.common.fused_rows import mismatch, plan_rows
from ditax.models.common.single_files import SHARD_BYTES, check_out, key_prefix, write_checked
from ditax.models.common.single_files import single_file_config as shared_config
from ditax.models.flux2 import loading
from ditax.models.flux2.config import Flux2Config
from ditax.models.flux2.original_names import fused, tensor_key

# keys only FLUX.1's BFL files have: the likeliest wrong file for a FLUX.2 config
_FLUX1_MARKS = ("vector_in.", ".img_mod.lin.", ".txt_mod.lin.", ".modulation.lin.")


def is_bfl(keys) -> bool:
    """Whether a checkpoint's keys use BFL's names (``double_blocks.`` / ``img_in.``)."""
    prefix = key_prefix(keys)
    return any(k[len(prefix):].startswith(("double_blocks.", "img_in.")) for k in keys)


def single_file_config(path, config, **overrides) -> Flux2Config:
    """The architecture of a single-file checkpoint: ``config`` is a :class:`Flux2Config`
    (the entry points read preset names and YAML paths into one first); ``overrides``
    (dtypes, remat, quantize …) replace its fields."""
    return shared_config(path, config, Flux2Config, "FLUX.2", "flux.2-klein-4b", **overrides)


def _hint(unexpected) -> str:
    """The fix of a file that does not fit the config."""
    if any(m in k for k in unexpected for m in _FLUX1_MARKS):
        return ("the file has FLUX.1 keys (vector_in / img_mod / modulation.lin): it is a "
                "FLUX.1 checkpoint; load it with a FLUX.1 config (config='flux.1-dev')")
    return ("check config= (the file's model: flux.2-dev has the guidance embedding, "
            "flux.2-klein-4b / flux.2-klein-9b not; or a YAML of its architecture) and that "
            "the file downloaded completely")


def open_single_file(path, cfg: Flux2Config, table, shapes: dict):
    """The file at ``path`` under the diffusers keys of ``table`` (our parameter ``shapes``):
    :class:`BflWeights`, or the file itself when it has diffusers' names unprefixed. Raises
    one :class:`~ditax.errors.WeightError` line naming every missing, unexpected and wrongly
    shaped key of the file, and the fix (headers only)."""
    weights = Weights.open(path)
    keys = weights.keys()
    prefix, bfl = key_prefix(keys), is_bfl(keys)
    names = tensor_key if bfl else (lambda key: (key, ""))   # diffusers' own names as stored
    sources, stored = plan_rows(upstream_shapes(table, shapes), prefix, names, fused)
    missing, unexpected, bad = mismatch(weights, stored)
    if missing or unexpected or bad:
        names = "BFL names" if bfl else "diffusers names"
        raise key_mismatch(f"FLUX.2 transformer weights in {path} ({names}) do not match "
                           f"{table.context}", missing, unexpected, _hint(unexpected), bad)
    if not bfl and not prefix:
        return weights
    return BflWeights(weights, sources)


def _open_weights(source, cfg, table, shapes):
    """The loader's ``open_weights``: a folder as stored, one file through
    :func:`open_single_file` (the table's diffusers keys; LoRAs merge under them)."""
    if not is_single_file(source):
        return plain_weights(source, cfg, table, shapes)
    return open_single_file(source, cfg, table, shapes), table, None


#: the FLUX.2 transformer loader (:data:`ditax.models.flux2.loading.LOADER`) reading single
#: files with ``config=``
LOADER = dataclasses.replace(loading.LOADER, single_file_config=single_file_config,
                             open_weights=_open_weights)


def load_transformer(path, dtype: str = "float32", mesh=None, attention="xla",
                     subfolder: str | None = "transformer", *, config=None, loras=None,
                     lora_strict: bool = True, lora_mode: str = "merged",
                     **model_overrides) -> loading.Flux2TransformerModel:
    """Load a FLUX.2 transformer from one ``.safetensors`` file (BFL's names or diffusers')
    with ``config=`` a :class:`Flux2Config` (``ditax.load_transformer``: also a preset name
    such as ``"flux.2-klein-4b"`` or a YAML path), or a folder as
    :func:`ditax.models.flux2.loading.load_transformer`; every argument is the one loader's
    (:meth:`ditax.models.common.loader.TransformerLoader.load`)."""
    return LOADER.load(path, dtype, mesh, attention, subfolder, config=config, loras=loras,
                       lora_strict=lora_strict, lora_mode=lora_mode, **model_overrides)


def _checked(path, config):
    """(config, weights under diffusers keys, table, parameter shapes) of ``path`` after the
    key and shape checks (headers only)."""
    from flax import nnx

    from ditax.models.flux2.build import abstract_model
    from ditax.models.flux2.convert import weight_table

    cfg = single_file_config(path, config)
    table = weight_table(cfg)
    shapes = param_shapes(nnx.state(abstract_model(cfg)))
    return cfg, open_single_file(path, cfg, table, shapes), table, shapes


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
    ``Flux2Transformer2DModel`` folder ``out`` (``ditax convert FILE --config NAME --out
    DIR``), after the same checks as loading: the fused q / k / v split, the final modulation's
    halves swapped back; ``dtype`` casts every tensor, ``loras`` are merged in as each tensor
    is read (:func:`ditax.models.common.single_files.write_checked`)."""
    from ditax.models.flux2.lora_names import LORA_NAMES

    out = check_out(out, dtype)
    cfg, weights, table, shapes = _checked(path, config)
    return write_checked(out, cfg, weights, {k: k for k in table.expected_keys()}, table,
                         shapes, LORA_NAMES, dtype=dtype, loras=loras, lora_strict=lora_strict,
                         shard_bytes=shard_bytes)


__all__ = ["BflWeights", "LOADER", "check_single_file", "is_bfl", "load_transformer",
           "open_single_file", "single_file_config", "write_diffusers_folder"]
