"""A LoRA file in any supported format → one table of updates keyed by module names.

Module names are the upstream (diffusers) names of the family whose
:class:`~ditax.lora.names.LoraNames` is passed as ``names``.
:func:`read_lora` opens a safetensors file, detects its format (:mod:`.formats`), groups the
tensors by target module and returns a :class:`Lora`: one :class:`LoraRow` per module with

- ``down`` ``[r, in]`` and ``up`` ``[out, r]`` (torch ``Linear`` layout), applied as
  ``W += scale * up @ down`` where ``scale = alpha / r`` (1 without ``alpha``; for diffusers
  files with adapter metadata, PEFT's ``lora_alpha / r`` or ``/ sqrt(r)`` with rsLoRA);
- ``bias`` ``[out]``: a bias delta (``diff_b``, ``lora_B.bias``);
- ``diff``: a full delta of the weight (``diff``, any parameter's shape).

The user's strength multiplies all three (as in diffusers' ``set_adapters`` and ComfyUI).
Tensors stay in their stored dtype; the merge computes in float32.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re

import numpy as np

from ditax.errors import WeightError
from ditax.io.convert import listing
from ditax.lora import formats
from ditax.lora.names import LoraNames

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, eq=False)
class LoraRow:
    """The update of one module (diffusers name ``key``, e.g. ``blocks.3.attn1.to_q``)."""

    key: str
    down: np.ndarray | None = None    # [r, in]
    up: np.ndarray | None = None      # [out, r]
    scale: float = 1.0                # alpha / r
    bias: np.ndarray | None = None    # [out]
    diff: np.ndarray | None = None    # the weight's shape

    @property
    def rank(self) -> int:
        return 0 if self.down is None else int(self.down.shape[0])


@dataclasses.dataclass(frozen=True, eq=False)
class Lora:
    """A parsed LoRA file: its rows, format, source, the keys no format recognised and the
    file's safetensors metadata (e.g. ``ditax_sample``: :mod:`ditax.pipelines.lora_sample`)."""

    source: str
    format: str
    rows: tuple[LoraRow, ...]
    unknown: tuple[str, ...] = ()
    metadata: dict = dataclasses.field(default_factory=dict)
    # another component's keys (``names.components``): component → {key: tensor}, as stored
    components: dict = dataclasses.field(default_factory=dict)

    def __repr__(self):
        ranks = sorted({r.rank for r in self.rows if r.rank})
        return (f"Lora({self.source!r}, format={self.format!r}, {len(self.rows)} modules, "
                f"ranks {ranks})")


def _peft_scales(metadata: dict) -> "callable | None":
    """module name, rank → PEFT scaling from diffusers' ``lora_adapter_metadata`` (None: none)."""
    raw = metadata.get("lora_adapter_metadata")
    if not raw:
        return None
    try:
        meta = {k.removeprefix("transformer."): v for k, v in json.loads(raw).items()}
    except (json.JSONDecodeError, AttributeError):
        return None
    if "lora_alpha" not in meta:
        return None
    alpha, patterns = meta["lora_alpha"], meta.get("alpha_pattern") or {}
    root = math.sqrt if meta.get("use_rslora") else (lambda r: r)

    def scale(module: str, rank: int) -> float:
        a = next((v for p, v in patterns.items() if re.match(rf"(.*\.)?({p})$", module)), alpha)
        return float(a) / root(rank)

    return scale


def _row(module: str, parts: dict, source: str, peft_scale) -> LoraRow:
    down, up = parts.get("down"), parts.get("up")
    names = parts["_keys"]
    if (down is None) != (up is None):
        have, lack = ("down", "up") if up is None else ("up", "down")
        raise WeightError(f"{source}: {names[have]} has no matching lora_{lack} tensor; the "
                          f"file is incomplete")
    if down is not None and down.ndim > 2:
        return _conv_row(module, parts, names, source, peft_scale)
    scale = 1.0
    if down is not None:
        if down.ndim != 2 or up.ndim != 2 or up.shape[1] != down.shape[0]:
            raise WeightError(f"{source}: {names['down']} {tuple(down.shape)} and {names['up']} "
                              f"{tuple(up.shape)} are not a LoRA pair ([r, in] and [out, r])")
        scale = _pair_scale(module, parts, down.shape[0], peft_scale)
    elif "alpha" in parts:
        raise WeightError(f"{source}: {names['alpha']} has no lora_down/lora_up pair")
    return LoraRow(module, down, up, scale, parts.get("bias"), parts.get("diff"))


def _pair_scale(module: str, parts: dict, rank: int, peft_scale) -> float:
    """A pair's scale: ``alpha / rank`` from the file's alpha, else the PEFT config's rule
    (``peft_scale(module, rank)``), else 1."""
    if "alpha" in parts:
        return float(np.asarray(parts["alpha"], np.float64).reshape(-1)[0]) / rank
    return peft_scale(module, rank) if peft_scale is not None else 1.0


def _conv_row(module: str, parts: dict, keys: dict, source: str, peft_scale) -> LoraRow:
    """A PEFT convolution LoRA (``lora_A`` ``[r, in, *k]``, ``lora_B`` ``[out, r, 1, ...]``)
    as a full delta ``scale * B @ A`` of the conv weight ``[out, in, *k]`` (conv weights are
    small; a merged-only update, as ``diff``)."""
    down, up = parts["down"], parts["up"]
    if (up.ndim != down.ndim or up.shape[1] != down.shape[0]
            or any(int(d) != 1 for d in up.shape[2:])):
        raise WeightError(f"{source}: {keys['down']} {tuple(down.shape)} and {keys['up']} "
                          f"{tuple(up.shape)} are not a convolution LoRA pair ([r, in, *k] "
                          f"and [out, r, 1, ...])")
    rank = down.shape[0]
    scale = _pair_scale(module, parts, rank, peft_scale)
    delta = (up.reshape(up.shape[0], rank).astype(np.float32)
             @ down.reshape(rank, -1).astype(np.float32)) * np.float32(scale)
    delta = delta.reshape((up.shape[0],) + tuple(down.shape[1:]))
    if parts.get("diff") is not None:
        delta = delta + parts["diff"].astype(np.float32)
    return LoraRow(module, None, None, 1.0, parts.get("bias"), delta)


def _unfused(grouped: dict, names: LoraNames, source: str):
    """``(module, parts)`` of every group, a fused layer's (``names.fused``) split into its
    modules: the rows of ``up`` / ``bias`` / ``diff`` are cut by the layer's pieces, ``down``
    and ``alpha`` are shared (each module's update is ``up[rows] @ down``)."""
    out = {}
    for module, g in grouped.items():
        pieces = names.fused(module) if names.fused is not None else None
        if not pieces:
            if module in out:
                raise WeightError(f"{source}: {module} is updated twice (also by a fused "
                                  f"layer's keys); keep one")
            out[module] = g
            continue
        part = next((p for p in ("up", "bias", "diff") if p in g), None)
        if part is None:        # an alpha alone: _row names what is missing
            out[module] = g
            continue
        units = sum(b - a for _, a, b in pieces)
        rows = g[part].shape[0]
        if rows % units:
            raise WeightError(f"{source}: {g['_keys'][part]} has {rows} rows; {module} stacks "
                              f"{units} equal units ({', '.join(m for m, _, _ in pieces)})")
        d, at, segs = rows // units, 0, {}
        for m, a, b in pieces:
            segs.setdefault(m, []).append((a * d, at, (b - a) * d))
            at += (b - a) * d
        for m, runs in segs.items():
            idx = np.concatenate([np.arange(f, f + n) for _, f, n in sorted(runs)])
            if m in out:
                raise WeightError(f"{source}: {m} is updated twice ({g['_keys'][part]} and "
                                  f"its own keys); keep one")
            out[m] = {k: (v[idx] if k in ("up", "bias", "diff") else v) for k, v in g.items()}
    return out.items()


def parse_lora(tensors: dict, metadata: dict | None = None, source: str = "the LoRA",
               strict: bool = True, *, names: LoraNames) -> Lora:
    """``{key: array}`` of a LoRA file → :class:`Lora` (rows named by ``names``, the family's).

    Keys that the detected format does not recognise raise one :class:`WeightError` listing
    them; ``strict=False`` logs a warning with the list instead and skips them. Keys under a
    prefix of ``names.components`` (another component of the family's pipelines) are kept in
    :attr:`Lora.components` for the pipeline loader that holds that component.
    """
    components: dict[str, dict] = {}
    for prefix, component in names.components.items():
        for key in [k for k in tensors if k.startswith(prefix)]:
            components.setdefault(component, {})[key] = tensors[key]
    if components:
        taken = {k for part in components.values() for k in part}
        tensors = {k: v for k, v in tensors.items() if k not in taken}
        log.info("%s: %s (applied where the pipeline loads %s)", source,
                 ", ".join(f"{len(v)} key(s) for the {c}" for c, v in components.items()),
                 " / ".join(components))
        if not tensors:
            return Lora(source, "components", (), (), dict(metadata or {}), components)
    fmt = formats.detect(tensors, names)
    if fmt is None:
        raise WeightError(f"{source}: not a {names.family} LoRA — none of its {len(tensors)} "
                          f"keys is in a known format ({names.description}); first keys: "
                          f"{listing(sorted(tensors), limit=5)}")
    parse = formats.FORMATS[fmt]
    grouped: dict[str, dict] = {}
    unknown = []
    for key in sorted(tensors):
        hit = parse(key, names)
        if hit is None:
            unknown.append(key)
            continue
        module, part = hit
        g = grouped.setdefault(module, {"_keys": {}})
        if part in g:
            raise WeightError(f"{source}: {key} and {g['_keys'][part]} are the same tensor of "
                              f"{module}; keep one")
        g[part], g["_keys"][part] = tensors[key], key
    text = formats.text_encoder_keys(unknown)
    if text and strict:
        raise WeightError(f"{source}: {len(text)} text-encoder LoRA key(s) ({listing(text)}); "
                          f"ditax applies LoRAs to {names.model} only — use a LoRA without "
                          f"text-encoder weights, or pass strict=False (ditax generate: "
                          f"--no-lora-strict) to skip them (the image then differs from one "
                          f"made with the text encoder's LoRA)")
    if unknown:
        msg = (f"{source} ({fmt} format): {len(unknown)} key(s) match no layer of "
               f"{names.model}: {listing(unknown)}")
        if strict:
            raise WeightError(msg + "; pass strict=False (ditax generate: --no-lora-strict) to "
                                    "skip them (a LoRA for another model?)")
        log.warning("%s; skipped (strict=False)", msg)
    peft_scale = _peft_scales(metadata or {}) if fmt == "peft" else None
    rows = tuple(_row(m, g, source, peft_scale) for m, g in _unfused(grouped, names, source))
    return Lora(source, fmt, rows, tuple(unknown), dict(metadata or {}), components)


def read_lora(path: str | os.PathLike, strict: bool = True, *, names: LoraNames) -> Lora:
    """Read and parse a LoRA ``.safetensors`` file (see :func:`parse_lora`)."""
    from ditax.io.weights import Weights

    w = Weights.open(path)
    tensors = {k: w.get(k) for k in w.keys()}
    return parse_lora(tensors, w.metadata(), str(path), strict, names=names)
