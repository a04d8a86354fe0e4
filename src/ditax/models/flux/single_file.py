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

import dataclasses

import numpy as np

from ditax.io.convert import key_mismatch, param_shapes
from ditax.lora.merge import upstream_shapes
from ditax.models.flux.config import FluxConfig
from ditax.models.flux.original_names import fused, tensor_key
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


@dataclasses.dataclass(frozen=True)
class _Source:
    """A diffusers tensor as segments ``(module rows start, stored key, stored rows start, n)``
    of stored tensors (one segment unless the module is split over a fused layer's rows)."""

    shape: tuple[int, ...]
    segments: tuple[tuple[int, str, int, int], ...]


def _plan(expected: dict[str, tuple], prefix: str):
    """Diffusers key → :class:`_Source`, and the stored keys with the shapes they must have."""
    sources, stored = {}, {}
    for key, shape in expected.items():
        orig, suffix = tensor_key(key)
        pieces = fused(orig)
        if pieces is None:
            sources[key] = _Source(shape, ((0, prefix + orig + suffix, 0, shape[0] if shape
                                            else 0),))
            stored[prefix + orig + suffix] = tuple(shape)
            continue
        name = key[:-len(suffix)] if suffix else key
        mine = sum(b - a for m, a, b in pieces if m == name)
        d = shape[0] // mine
        segs, at = [], 0
        for m, a, b in pieces:
            if m == name:
                segs.append((a * d, prefix + orig + suffix, at, (b - a) * d))
            at += (b - a) * d
        sources[key] = _Source(shape, tuple(sorted(segs)))
        stored[prefix + orig + suffix] = (at,) + tuple(shape[1:])
    return sources, stored


class BflWeights:
    """A BFL checkpoint (a :class:`~ditax.io.weights.Weights`) shown under diffusers keys:
    ``keys()``, ``shape``, ``dtype``, ``get``, ``read(key, index)`` (module docstring)."""

    def __init__(self, weights, sources: dict[str, _Source]):
        self._inner, self._sources = weights, sources
        self.source = weights.source

    def keys(self) -> list[str]:
        return list(self._sources)

    def __contains__(self, key) -> bool:
        return key in self._sources

    def __len__(self) -> int:
        return len(self._sources)

    def metadata(self) -> dict:
        return self._inner.metadata()

    def shape(self, key: str) -> tuple[int, ...]:
        return self._sources[key].shape

    def dtype(self, key: str) -> np.dtype:
        return self._inner.dtype(self._sources[key].segments[0][1])

    def get(self, key: str) -> np.ndarray:
        return self.read(key, ())

    def read(self, key: str, index: tuple) -> np.ndarray:
        """``tensor[index]`` (slices) of the diffusers tensor ``key``, reading only the rows
        of the stored tensor(s) it needs."""
        src = self._sources[key]
        if not src.shape:
            return self._inner.read(src.segments[0][1], index)
        rows, rest = (tuple(index) + (slice(None),))[0], tuple(index[1:])
        start, stop, step = rows.indices(src.shape[0])
        if step != 1:
            raise ValueError(f"{key}: strided reads are not supported")
        parts = []
        for at, stored, off, n in src.segments:
            lo, hi = max(start, at), min(stop, at + n)
            if lo < hi:
                parts.append(self._inner.read(stored, (slice(off + lo - at, off + hi - at),)
                                              + rest))
        if not parts:   # an empty slice (dtype probes)
            return self._inner.read(src.segments[0][1], (slice(0, 0),) + rest)
        return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)


def open_single_file(path, cfg: FluxConfig, table, shapes: dict):
    """The file at ``path`` as :class:`BflWeights` (diffusers keys of ``table``, our
    parameter ``shapes``), or the file itself when it already has diffusers keys; raises one
    :class:`~ditax.errors.WeightError` naming every missing, unexpected and wrongly shaped stored key."""
    from ditax.io.weights import Weights

    weights = Weights.open(path)
    if not is_bfl(weights.keys()):
        return weights
    prefix = key_prefix(weights.keys())
    sources, stored = _plan(upstream_shapes(table, shapes), prefix)
    have = set(weights.keys())
    missing = [k for k in stored if k not in have]
    unexpected = sorted(have - set(stored))
    bad = [f"{k}: shape {tuple(weights.shape(k))} but the model expects {want}"
           for k, want in stored.items() if k in have and tuple(weights.shape(k)) != want]
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
