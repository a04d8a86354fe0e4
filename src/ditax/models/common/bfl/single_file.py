"""BFL's single-file checkpoints of FLUX.1 and FLUX.2 (``flux1-dev.safetensors``,
``flux2-dev.safetensors``, ``flux-2-klein-4b.safetensors``) read as a diffusers folder:
:class:`BflSingleFile`, one per family (:mod:`ditax.models.flux.single_file`,
:mod:`ditax.models.flux2.single_file`), from the family's data.

Such a file holds the transformer under BFL's names (the family's
:class:`~ditax.models.common.bfl.names.BflNames`: fused q / k / v, the final modulation's
halves swapped, RMSNorm gains as ``.scale``), optionally under ``model.diffusion_model.`` /
``diffusion_model.`` (ComfyUI), and no ``config.json``: the architecture comes from
``config=``, the family's model config (preset names and YAML paths are read into one above
the models, by ``ditax.load_transformer`` and ``ditax convert``). A file under diffusers' own
names reads too.

:meth:`BflSingleFile.open` checks the file's keys and shapes against the config from the
headers alone — one :class:`~ditax.errors.WeightError` naming every missing, unexpected and
wrongly shaped key under the file's own names, with the fix — and returns :class:`BflWeights`,
the file shown under the diffusers keys of the family's table: a fused layer's member is a
row range of the stored tensor, read slice by slice, so the loader (strict checks, sharded
reads, merged LoRAs, 8-bit quantization) is the folders' own. :meth:`BflSingleFile.write`
(``ditax convert FILE --config NAME --out DIR``) writes the file as a diffusers folder after
the same checks.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ditax.io.convert import key_mismatch, param_shapes
from ditax.io.weights import Weights, is_single_file
from ditax.lora.merge import upstream_shapes
from ditax.models.common.bfl.loading import blocks_summary
from ditax.models.common.fused_rows import FusedRowsView as BflWeights
from ditax.models.common.fused_rows import mismatch, plan_rows
from ditax.models.common.loader import plain_weights
from ditax.models.common.single_files import SHARD_BYTES, check_out, key_prefix, write_checked
from ditax.models.common.single_files import single_file_config as shared_config


def is_bfl(keys) -> bool:
    """Whether a checkpoint's keys use BFL's names (``double_blocks.`` / ``img_in.``)."""
    prefix = key_prefix(keys)
    return any(k[len(prefix):].startswith(("double_blocks.", "img_in.")) for k in keys)


@dataclass(frozen=True)
class BflSingleFile:
    """One family's single files, as data.

    - ``package``: the family's package (its ``build``, ``convert`` and ``lora_names``
      modules are read from it when a file is checked or written);
    - ``config_class``, ``family`` (its name in messages), ``preset`` (a preset to suggest);
    - ``names``: the family's :class:`~ditax.models.common.bfl.names.BflNames`;
    - ``hint(unexpected)``: the fix of a file that does not fit the config.
    """

    package: str
    config_class: type
    family: str
    preset: str
    names: object
    hint: Callable

    def _module(self, name: str):
        return importlib.import_module(f"{self.package}.{name}")

    def config(self, path, config, **overrides):
        """The architecture of a single-file checkpoint: ``config`` is the family's model
        config (the entry points read preset names and YAML paths into one first);
        ``overrides`` (dtypes, remat, quantize …) replace its fields."""
        return shared_config(path, config, self.config_class, self.family, self.preset,
                             **overrides)

    def open(self, path, cfg, table, shapes: dict):
        """The file at ``path`` under the diffusers keys of ``table`` (our parameter
        ``shapes``): :class:`BflWeights`, or the file itself when it has diffusers' names
        unprefixed. Raises one :class:`~ditax.errors.WeightError` naming every missing,
        unexpected and wrongly shaped key of the file, and the fix (headers only)."""
        weights = Weights.open(path)
        keys = weights.keys()
        prefix, bfl = key_prefix(keys), is_bfl(keys)
        names = self.names.tensor_key if bfl else (lambda key: (key, ""))   # diffusers' own
        sources, stored = plan_rows(upstream_shapes(table, shapes), prefix, names,
                                    self.names.fused)
        missing, unexpected, bad = mismatch(weights, stored)
        if missing or unexpected or bad:
            kind = "BFL names" if bfl else "diffusers names"
            raise key_mismatch(f"{self.family} transformer weights in {path} ({kind}) do not "
                               f"match {table.context}", missing, unexpected,
                               self.hint(unexpected), bad)
        if not bfl and not prefix:
            return weights
        return BflWeights(weights, sources)

    def open_weights(self, source, cfg, table, shapes):
        """The loader's ``open_weights``: a folder as stored, one file through :meth:`open`
        (the table's diffusers keys; LoRAs merge under them)."""
        if not is_single_file(source):
            return plain_weights(source, cfg, table, shapes)
        return self.open(source, cfg, table, shapes), table, None

    def checked(self, path, config):
        """(config, weights under diffusers keys, table, parameter shapes) of ``path`` after
        the key and shape checks (headers only)."""
        from flax import nnx

        cfg = self.config(path, config)
        table = self._module("convert").weight_table(cfg)
        shapes = param_shapes(nnx.state(self._module("build").abstract_model(cfg)))
        return cfg, self.open(path, cfg, table, shapes), table, shapes

    def check(self, path, config) -> str:
        """Key and shape check of a single-file checkpoint against ``config`` from its
        headers alone (``ditax convert FILE --config NAME``); returns a one-line summary."""
        cfg, weights, _, shapes = self.checked(path, config)
        n = sum(int(np.prod(s)) for s in shapes.values())
        return (f"{path}: OK — {blocks_summary(cfg)}, {n / 1e9:.3f} B params, "
                f"{len(weights)} tensors")

    def write(self, path, config, out, *, dtype: str | None = None, loras=None,
              lora_strict: bool = True, shard_bytes: int = SHARD_BYTES):
        """Write the single-file checkpoint ``path`` (BFL's names or diffusers') as a
        diffusers folder ``out``, after the same checks as loading (the fused layers split,
        the final modulation's halves swapped back); ``dtype`` casts every tensor, ``loras``
        are merged in as each tensor is read
        (:func:`ditax.models.common.single_files.write_checked`)."""
        out = check_out(out, dtype)
        cfg, weights, table, shapes = self.checked(path, config)
        return write_checked(out, cfg, weights, {k: k for k in table.expected_keys()}, table,
                             shapes, self._module("lora_names").LORA_NAMES, dtype=dtype,
                             loras=loras, lora_strict=lora_strict, shard_bytes=shard_bytes)


__all__ = ["BflSingleFile", "BflWeights", "is_bfl"]
