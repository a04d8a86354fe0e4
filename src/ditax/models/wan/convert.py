"""diffusers ``WanTransformer3DModel`` weights ↔ ditax parameters: one table.

Each row: our parameter path, the diffusers key (``{i}`` = block index for the stacked
blocks), the explicit transform, and the logical axis names used for sharding. The same table
drives loading, the shape check on every tensor, the missing/unexpected key report, and the
parameter PartitionSpecs.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

ID = "id"
T = "T"            # torch Linear weight [out, in] -> kernel [in, out]
CONV = "conv"      # Conv3d weight [D, C, pt, ph, pw] -> [pt, ph, pw, C, D]


@dataclasses.dataclass(frozen=True)
class Row:
    path: tuple[str, ...]
    key: str
    transform: str
    axes: tuple  # logical names of OUR tensor (without the stacked "layers" axis)


def _linear(path, key, axes_in, axes_out):
    return [Row(path + ("kernel",), key + ".weight", T, (axes_in, axes_out)),
            Row(path + ("bias",), key + ".bias", ID, (axes_out,))]


def _block_rows(cross_attn_norm: bool) -> list[Row]:
    rows = []
    for a in ("attn1", "attn2"):
        for p in ("to_q", "to_k", "to_v"):
            rows += _linear(("blocks", a, p), f"blocks.{{i}}.{a}.{p}", "embed", "heads")
        rows += _linear(("blocks", a, "to_out"), f"blocks.{{i}}.{a}.to_out.0", "heads", "embed")
        rows += [Row(("blocks", a, "norm_q", "scale"), f"blocks.{{i}}.{a}.norm_q.weight", ID,
                     ("heads",)),
                 Row(("blocks", a, "norm_k", "scale"), f"blocks.{{i}}.{a}.norm_k.weight", ID,
                     ("heads",))]
    rows += _linear(("blocks", "ffn", "proj_in"), "blocks.{i}.ffn.net.0.proj", "embed", "mlp")
    rows += _linear(("blocks", "ffn", "proj_out"), "blocks.{i}.ffn.net.2", "mlp", "embed")
    if cross_attn_norm:
        rows += [Row(("blocks", "norm2", "scale"), "blocks.{i}.norm2.weight", ID, ("norm",)),
                 Row(("blocks", "norm2", "bias"), "blocks.{i}.norm2.bias", ID, ("norm",))]
    rows.append(Row(("blocks", "scale_shift_table"), "blocks.{i}.scale_shift_table", ID,
                    (None, "modulation", "embed")))
    return rows


def table(cross_attn_norm: bool = True) -> list[Row]:
    ce = ("condition_embedder",)
    rows = [
        Row(("patch_embedding_kernel",), "patch_embedding.weight", CONV,
            ("kernel_t", "kernel_h", "kernel_w", "in_channels", "embed")),
        Row(("patch_embedding_bias",), "patch_embedding.bias", ID, ("embed",)),
        *_linear(ce + ("time_embedder", "linear_1"), "condition_embedder.time_embedder.linear_1",
                 "freq", "embed"),
        *_linear(ce + ("time_embedder", "linear_2"), "condition_embedder.time_embedder.linear_2",
                 "embed", None),
        *_linear(ce + ("time_proj",), "condition_embedder.time_proj", "embed", None),
        *_linear(ce + ("text_embedder", "linear_1"), "condition_embedder.text_embedder.linear_1",
                 "text_embed", None),
        *_linear(ce + ("text_embedder", "linear_2"), "condition_embedder.text_embedder.linear_2",
                 "embed", None),
        *_block_rows(cross_attn_norm),
        *_linear(("proj_out",), "proj_out", "embed", None),
        Row(("scale_shift_table",), "scale_shift_table", ID, (None, "modulation", "embed")),
    ]
    return rows


def apply_transform(x: np.ndarray, transform: str) -> np.ndarray:
    if transform == ID:
        return x
    if transform == T:
        return np.asarray(x).T
    if transform == CONV:
        return np.asarray(x).transpose(2, 3, 4, 1, 0)
    raise ValueError(transform)


def invert_transform(x: np.ndarray, transform: str) -> np.ndarray:
    if transform == CONV:
        return np.asarray(x).transpose(4, 3, 0, 1, 2)
    return apply_transform(x, transform)


def is_stacked(row: Row) -> bool:
    return "{i}" in row.key


def expected_keys(num_layers: int, cross_attn_norm: bool = True) -> list[str]:
    keys = []
    for r in table(cross_attn_norm):
        if is_stacked(r):
            keys += [r.key.format(i=i) for i in range(num_layers)]
        else:
            keys.append(r.key)
    return keys


IGNORED_UNEXPECTED = ("norm_added_q",)  # diffusers also ignores these on load


from ditax.errors import WeightError  # noqa: E402  (re-exported)


def check_keys(available: list[str], num_layers: int, cross_attn_norm: bool = True):
    """Raise :class:`WeightError` listing every missing and unexpected key."""
    want = set(expected_keys(num_layers, cross_attn_norm))
    have = set(available)
    missing = sorted(want - have)
    unexpected = sorted(k for k in have - want if not any(s in k for s in IGNORED_UNEXPECTED))
    if missing or unexpected:
        def fmt(ks):
            return ", ".join(ks[:20]) + (f" ... (+{len(ks) - 20} more)" if len(ks) > 20 else "")
        msg = ["transformer weights do not match the config (num_layers="
               f"{num_layers}, cross_attn_norm={cross_attn_norm})"]
        if missing:
            msg.append(f"missing {len(missing)} key(s): {fmt(missing)}")
        if unexpected:
            msg.append(f"unexpected {len(unexpected)} key(s): {fmt(unexpected)}")
        msg.append("check that config.json belongs to these weights and that every shard "
                   "downloaded completely")
        raise WeightError("; ".join(msg))


def load_row(get: Callable[[str], np.ndarray], row: Row, num_layers: int,
             expected_shape: tuple[int, ...]) -> np.ndarray:
    """Read, transform and (for block rows) stack one parameter; check its shape."""
    if is_stacked(row):
        parts = []
        for i in range(num_layers):
            key = row.key.format(i=i)
            a = apply_transform(get(key), row.transform)
            if a.shape != tuple(expected_shape[1:]):
                raise WeightError(f"{key}: shape {tuple(get(key).shape)} (→ {a.shape} after "
                                  f"{row.transform}) but the model expects {expected_shape[1:]}")
            parts.append(a)
        return np.stack(parts)
    a = apply_transform(get(row.key), row.transform)
    if a.shape != tuple(expected_shape):
        raise WeightError(f"{row.key}: shape {tuple(get(row.key).shape)} (→ {a.shape} after "
                          f"{row.transform}) but the model expects {tuple(expected_shape)}")
    return a


def param_axes(cross_attn_norm: bool = True) -> dict[tuple[str, ...], tuple]:
    """Our parameter path → logical axis names (the stacked blocks get a leading "layers")."""
    out = {}
    for r in table(cross_attn_norm):
        out[r.path] = (("layers",) + tuple(r.axes)) if is_stacked(r) else tuple(r.axes)
    return out
