"""Conversion tables: our parameter path ↔ an upstream (diffusers / transformers) tensor key.

One form for every model. A :class:`Table` lists :class:`Row` s — our parameter path, the
upstream key (``{i}`` marks a stacked row: layer ``i`` of our leading ``layers`` axis), and an
explicit :class:`Transform` between the two layouts. The same table is used both ways:

- upstream → ditax: :func:`load_params` checks the keys (one :class:`WeightError` listing every
  missing and unexpected key), checks every tensor's shape (naming the key and both shapes),
  then reads each parameter — with a sharding, straight into each device's shard;
- ditax → upstream: :func:`export` gives ``{key: array}`` in the upstream layout, ready for
  ``safetensors.numpy.save_file``.

The model tables live with their models (``models/wan/convert.py``, ``models/vae/wan/convert.py``,
``models/encoders/t5.py``).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ditax.errors import WeightError


@dataclasses.dataclass(frozen=True)
class Transform:
    """Upstream tensor → ours: drop ``squeeze`` trailing unit axes, then transpose by ``perm``."""

    name: str
    perm: tuple[int, ...] | None = None
    squeeze: int = 0

    def to_ours(self, x: np.ndarray) -> np.ndarray:
        if self.squeeze:
            x = x.reshape(x.shape[:-self.squeeze])
        return np.transpose(x, self.perm) if self.perm else x

    def to_theirs(self, y: np.ndarray) -> np.ndarray:
        if self.perm:
            y = np.transpose(y, np.argsort(self.perm))
        return y.reshape(y.shape + (1,) * self.squeeze) if self.squeeze else y

    def theirs_shape(self, ours: tuple[int, ...]) -> tuple[int, ...]:
        """The upstream shape that converts to ``ours``."""
        return self.to_theirs(np.broadcast_to(np.zeros((), np.uint8), ours)).shape

    def theirs_index(self, index: tuple) -> tuple:
        """A slice of our tensor (tuple of slices) → the slice of the upstream tensor to read."""
        if not self.perm:
            return tuple(index) + (slice(None),) * self.squeeze
        out = [slice(None)] * (len(self.perm) + self.squeeze)
        for ours_axis, theirs_axis in enumerate(self.perm):
            out[theirs_axis] = index[ours_axis]
        return tuple(out)


ID = Transform("id")
TRANSPOSE = Transform("T", (1, 0))                # torch Linear [out, in] -> kernel [in, out]
CONV3D = Transform("conv3d", (2, 3, 4, 1, 0))    # Conv3d [O, I, t, h, w] -> [t, h, w, I, O]
CONV2D = Transform("conv2d", (2, 3, 1, 0))       # Conv2d [O, I, h, w] -> [h, w, I, O]
POINTWISE = Transform("pointwise", (1, 0), 2)    # 1x1 Conv2d [O, I, 1, 1] -> Dense [I, O]


@dataclasses.dataclass(frozen=True)
class HeadsOut(Transform):
    """torch Linear ``[N·K, in]`` → a head-major kernel ``[N, in, K]`` (``head_dim`` = K;
    :class:`ditax.nn.Linear` with ``out_heads``). A sharded read may split N and ``in``,
    never K (rows ``n·K .. (n+1)·K`` of the upstream tensor are one head)."""

    head_dim: int = 0

    def to_ours(self, x: np.ndarray) -> np.ndarray:
        return np.swapaxes(x.reshape(-1, self.head_dim, x.shape[-1]), 1, 2)

    def to_theirs(self, y: np.ndarray) -> np.ndarray:
        return np.swapaxes(y, 1, 2).reshape(-1, y.shape[1])

    def theirs_shape(self, ours: tuple[int, ...]) -> tuple[int, ...]:
        n, din, k = ours
        return (n * k, din)

    def theirs_index(self, index: tuple) -> tuple:
        heads, cols, k = tuple(index) + (slice(None),) * (3 - len(index))
        if k.indices(self.head_dim) != (0, self.head_dim, 1) or heads.step not in (None, 1):
            raise ValueError(f"{self.name}: a read may split heads and inputs only, got {index}")
        rows = slice(None if heads.start is None else heads.start * self.head_dim,
                     None if heads.stop is None else heads.stop * self.head_dim)
        return rows, cols


def heads_out(head_dim: int) -> HeadsOut:
    """:class:`HeadsOut` for heads of ``head_dim`` channels."""
    return HeadsOut(f"[N*K, in] -> [N, in, K] (K={head_dim})", head_dim=head_dim)


def linear_weight(t: Transform) -> bool:
    """Whether ``t`` reads a torch Linear weight (plain or head-major kernel): the layers
    LoRA updates."""
    return t == TRANSPOSE or isinstance(t, HeadsOut)


def unit_axes(n: int) -> Transform:
    """A gain stored broadcastable, ``[C, 1, ..., 1]`` (``n`` unit axes), kept as ``[C]``."""
    return Transform(f"[C{', 1' * n}] -> [C]", None, n)


@dataclasses.dataclass(frozen=True)
class Row:
    """One parameter: our path, the upstream key, the transform, and model metadata.

    ``axes`` are logical axis names of our tensor (without the stacked ``layers`` axis) for
    models that shard by the table; ``alt`` are other upstream names of the same tensor (the
    first present is read); ``layers``: the depth of this stacked row's stack where a model
    has stacks of different depths (Flux: double and single blocks), None = the table's.
    ``init``: an optional parameter (e.g. a gate a config adds, in the tables of the models
    that have it: :meth:`Table.extended`): a checkpoint without its key(s) leaves it filled
    with ``init`` (a dense checkpoint loads into a gated model; a stacked row's layers all or
    none).
    """

    path: tuple[str, ...]
    key: str
    transform: Transform = ID
    axes: tuple = ()
    alt: tuple[str, ...] = ()
    layers: int | None = None
    init: float | None = None

    @property
    def stacked(self) -> bool:
        return "{i}" in self.key


def logical_axes(rows) -> dict[tuple[str, ...], tuple]:
    """Our parameter path → logical axis names of each row (a stacked row's get a leading
    ``"layers"``): what a model's sharding rules read."""
    return {r.path: (("layers",) + tuple(r.axes)) if r.stacked else tuple(r.axes)
            for r in rows}


@dataclasses.dataclass(frozen=True)
class Table:
    """A model's rows, the layer count of its stacked rows, and what to say in messages.

    ``ignore``: regexes of upstream keys that may be present and are not read (e.g. a seq2seq
    checkpoint's decoder); ``context``: the config values the weights must match; ``hints``:
    ``(regex, fix)`` pairs: when every unexpected key (and nothing missing) matches a regex,
    its fix is the error's last words instead of the general one (e.g. a setting that adds
    those parameters).
    """

    name: str
    rows: tuple[Row, ...]
    layers: int = 0
    ignore: tuple[str, ...] = ()
    context: str = "config.json"
    hints: tuple[tuple[str, str], ...] = ()

    def fix_for(self, missing, unexpected) -> str:
        """The fix a key mismatch's error ends with (:attr:`hints`, else the general one)."""
        for pattern, fix in self.hints:
            if unexpected and not missing and all(re.search(pattern, k) for k in unexpected):
                return fix
        return ("check that config.json belongs to these weights and that every shard "
                "downloaded completely")

    def names(self, row: Row, key: str | None = None) -> list[str]:
        """The upstream keys of one row (one per layer for a stacked row)."""
        key = row.key if key is None else key
        return [key.format(i=i) for i in range(self.depth(row))] if row.stacked else [key]

    def depth(self, row: Row) -> int:
        """How many layers the stacked ``row`` has (its own ``layers``, else the table's)."""
        return self.layers if row.layers is None else row.layers

    def expected_keys(self) -> list[str]:
        return [k for r in self.rows for k in self.names(r)]

    def extended(self, rows) -> "Table":
        """This table with ``rows`` added (e.g. a module's optional rows, :attr:`Row.init`)."""
        return dataclasses.replace(self, rows=self.rows + tuple(rows)) if rows else self


def listing(items: list[str], sep: str = ", ", limit: int = 20) -> str:
    """The first ``limit`` items joined, with a count of the rest (for error messages)."""
    more = f" ... (+{len(items) - limit} more)" if len(items) > limit else ""
    return sep.join(items[:limit]) + more


def key_mismatch(head: str, missing, unexpected, hint: str, bad=()) -> WeightError:
    """The one error for weights that do not match a table: ``head``, then every missing,
    unexpected and wrong-shape key (each list cut by :func:`listing`), then ``hint`` (the fix)."""
    msg = [head]
    if missing:
        msg.append(f"missing {len(missing)} key(s): {listing(missing)}")
    if unexpected:
        msg.append(f"unexpected {len(unexpected)} key(s): {listing(unexpected)}")
    if bad:
        msg.append(f"{len(bad)} of the wrong shape: {listing(bad, '; ')}")
    msg.append(hint)
    return WeightError("; ".join(msg))


def check_keys(table: Table, available, source="the checkpoint") -> dict[str, str]:
    """Expected key → the key to read (an ``alt`` name when the main one is absent).

    Raises one :class:`WeightError` listing every missing and every unexpected key.
    """
    have = set(available)
    chosen, alts = {}, set()
    for row in table.rows:
        options = [table.names(row)] + [table.names(row, a) for a in row.alt]
        for i, want in enumerate(options[0]):
            names = [opt[i] for opt in options]
            alts.update(names)
            found = next((n for n in names if n in have), None)
            if found is not None:
                chosen[want] = found
    optional = {k for r in table.rows if r.init is not None
                and not any(k in chosen for k in table.names(r)) for k in table.names(r)}
    missing = [k for k in table.expected_keys() if k not in chosen and k not in optional]
    unexpected = sorted(k for k in have - alts
                        if not any(re.search(p, k) for p in table.ignore))
    if missing or unexpected:
        raise key_mismatch(f"{table.name} weights in {source} do not match {table.context}",
                           missing, unexpected, table.fix_for(missing, unexpected))
    return chosen


def _leaves(tree: Mapping, prefix=()):
    """(path as strings, parent dict, key) of every leaf of a nested dict."""
    for k, v in tree.items():
        path = prefix + (str(k),)
        if isinstance(v, Mapping):
            yield from _leaves(v, path)
        else:
            yield path, tree, k


def check_shapes(table: Table, shape_of: Callable[[str], tuple], ours: dict, keys: dict,
                 source="the checkpoint") -> None:
    """Raise one :class:`WeightError` naming every tensor whose stored shape does not convert
    to our parameter's shape (``ours``: path → shape; ``keys``: from :func:`check_keys`)."""
    bad = []
    for row in table.rows:
        want = tuple(ours[row.path])[1:] if row.stacked else tuple(ours[row.path])
        theirs = row.transform.theirs_shape(want)
        for k in table.names(row):
            if k not in keys:       # an optional row the checkpoint lacks: filled with init
                continue
            got = tuple(shape_of(keys[k]))
            if got != theirs:
                bad.append(f"{keys[k]}: shape {got} but the model expects {theirs} "
                           f"(our {'.'.join(row.path)} {want}, {row.transform.name})")
    if bad:
        raise WeightError(f"{table.name} weights in {source} do not fit {table.context}: "
                          f"{listing(bad, '; ')}")


def read_param(weights, row: Row, keys: dict, shape: tuple, dtype, sharding=None,
               convert=None) -> jax.Array:
    """One parameter in our layout and ``dtype``; with a sharding, each device's shard is read
    on its own (``jax.make_array_from_callback``): no device gets a full copy. ``convert(x,
    index)`` replaces the cast of each slice (8-bit weights: quantized with their scales)."""
    convert = convert or (lambda x, index: x.astype(dtype, copy=False))   # no copy as stored

    def block(index: tuple) -> np.ndarray:
        if row.init is not None and row.key.format(i=0) not in keys:   # absent: its init
            return np.full(tuple(len(range(*s.indices(n))) for s, n in zip(index, shape)),
                           row.init, np.float32)
        return _read_block(weights, row, keys, shape, index)

    full = (slice(None),) * len(shape)
    if sharding is None:
        # device_put, not jnp.asarray: in this jax, jnp.asarray of a numpy array compiles an
        # identity program per shape (lax.stage), ~25 ms a parameter shape at every load
        return jax.device_put(convert(np.asarray(block(full)), full))
    seen = {}

    def shard(index):
        index = tuple(index) + full[len(index):]
        tag = tuple(s.indices(n) for s, n in zip(index, shape))
        if tag not in seen:  # replicas of one shard are read once
            seen[tag] = convert(np.asarray(block(index)), index)
        return seen[tag]

    return jax.make_array_from_callback(tuple(shape), sharding, shard)


def _quantized(weights, row: Row, keys: dict, shape: tuple, quantize, sharding):
    """A kernel through its quantizer (:func:`ditax.nn.quant.reader`): one float pass for
    its scales (read like the parameter, a layer at a time), then each shard quantized as
    it is read; (kernel, scales as numpy)."""
    stored = ([keys[row.key.format(i=i)] for i in range(shape[0])] if row.stacked
              else [keys[row.key]])       # the checkpoint's keys of this kernel, layer by layer
    convert, scale = quantize(lambda index: _read_block(weights, row, keys, shape, index),
                              shape, row.stacked, stored)
    return read_param(weights, row, keys, shape, None, sharding, convert), scale


def _read_block(weights, row: Row, keys: dict, shape: tuple, index: tuple) -> np.ndarray:
    """Our layout's slice ``index`` of one parameter, as stored (float)."""
    if not row.stacked:
        x = weights.read(keys[row.key], row.transform.theirs_index(index))
        return row.transform.to_ours(x)
    sub = row.transform.theirs_index(index[1:])
    return np.stack([row.transform.to_ours(weights.read(keys[row.key.format(i=i)], sub))
                     for i in range(*index[0].indices(shape[0]))])


def param_shapes(state) -> dict[tuple[str, ...], tuple[int, ...]]:
    """Parameter path (strings) → shape, for an (abstract) ``nnx.State`` or its pure dict."""
    pure = nnx.to_pure_dict(state) if isinstance(state, nnx.State) else state
    return {path: tuple(parent[k].shape) for path, parent, k in _leaves(pure)}


def check_weights(table: Table, weights, shapes: dict) -> dict[str, str]:
    """Key check, then shape check against ``shapes`` (:func:`param_shapes`), from the headers
    only; returns :func:`check_keys`' map of the keys to read."""
    source = getattr(weights, "source", "the checkpoint")
    keys = check_keys(table, weights.keys(), source)
    check_shapes(table, weights.shape, shapes, keys, source)
    return keys


def load_params(table: Table, weights, state, dtype, sharding=None, quantize=None):
    """Fill ``state`` (an abstract ``nnx.State``) from ``weights`` through ``table``.

    Checks keys and shapes first (nothing is read from a checkpoint that does not fit);
    ``sharding(path, shape)`` gives a parameter's sharding (None: a plain array).
    ``quantize``: kernel path → its quantizer (:func:`ditax.nn.quant.reader`); such a
    kernel's ``kernel_scale`` beside it (no row of its own) is filled with it.
    """
    quantize = quantize or {}
    pure = nnx.to_pure_dict(state)
    shapes = param_shapes(pure)
    rows = {r.path: r for r in table.rows}
    scales = {p[:-1] + ("kernel_scale",) for p in quantize}
    unmapped = [".".join(p) for p in shapes if p not in rows and p not in scales]
    if unmapped:
        raise KeyError(f"{table.name}: no conversion row for parameter(s) {unmapped}")
    keys = check_weights(table, weights, shapes)
    for path, parent, k in _leaves(pure):
        if path in scales:
            continue
        sh = None if sharding is None else sharding(path, shapes[path])
        if path not in quantize:
            parent[k] = read_param(weights, rows[path], keys, shapes[path], dtype, sh)
            continue
        parent[k], scale = _quantized(weights, rows[path], keys, shapes[path], quantize[path],
                                      sh)
        spath = path[:-1] + ("kernel_scale",)
        ssh = None if sharding is None else sharding(spath, scale.shape)
        parent["kernel_scale"] = (jnp.asarray(scale) if ssh is None else
                                  jax.make_array_from_callback(scale.shape, ssh,
                                                               lambda i, s=scale: s[i]))
    nnx.replace_by_pure_dict(state, pure)
    return state


def load_module(make: Callable, table_of: Callable, folder, dtype) -> nnx.Module:
    """The module ``make()`` with its parameters read from the safetensors of ``folder``
    through ``table_of(module)`` (its weight table, from the abstract module: no weights are
    allocated before they are read) and cast to ``dtype`` (:func:`load_params`'s checks)."""
    from ditax.io.weights import Weights

    abstract = nnx.eval_shape(make)
    graphdef, state = nnx.split(abstract)
    state = load_params(table_of(abstract), Weights.open(folder), state, jnp.dtype(dtype))
    return nnx.merge(graphdef, state)


def export(table: Table, params) -> dict[str, np.ndarray]:
    """Our parameters (a module, an ``nnx.State`` or its pure dict) → ``{upstream key: array}``
    in the upstream layout and the parameters' dtype."""
    if isinstance(params, nnx.Module):
        params = nnx.state(params)
    if isinstance(params, nnx.State):
        params = nnx.to_pure_dict(params)
    flat = {path: parent[k] for path, parent, k in _leaves(params)}
    out = {}
    for row in table.rows:
        v = np.asarray(flat[row.path])
        for i, key in enumerate(table.names(row)):
            out[key] = row.transform.to_theirs(v[i] if row.stacked else v)
    return out
