"""8-bit weights (and optionally activations) for :class:`ditax.nn.Linear`, post-training.

A quantized ``Linear`` stores its kernel in 8 bits — ``int8`` (symmetric, ``q = round(w /
s)``, ``|q| <= 127``) or ``float8_e4m3fn`` (``q = fp8(w / s)``, ``|q| <= 448``) — with one
float32 scale per output channel, ``kernel_scale`` (the kernel's shape without its input axis,
the second-to-last one in both layouts: ``[..., in, out] -> [..., out]``, head-major ``[..., N,
in, K] -> [..., N, K]``), sharded like the kernel without that axis. ``s = max|w| / qmax``
over the input axis, so no calibration data is needed.

The dot (:meth:`QuantSpec.einsum`): weights only — ``(x @ q) * s`` in the compute dtype (the
8-bit kernel converted inside the dot's fusion; a per-output-channel scale commutes with the
contraction). With activations — ``x`` quantized per token (the scale ``max|x| / qmax`` over
the contracted axes), then ``int8 x int8 -> int32`` (``preferred_element_type``; XLA runs
integer dots on every backend) or ``fp8 x fp8 -> float32`` where the platform has fp8 dots
(:func:`~ditax.nn.quant_target.native_dots`; elsewhere the fp8 values are widened to the
compute dtype first: the same numbers, no speed-up; on a TPU without fp8 matrix units the
mode is refused, :func:`~ditax.nn.quant_target.check_dots`), and both scales applied to the
result.

Quantization is a property of the module (``Linear.quant``, static in the graph), set on the
abstract model by :func:`quantize_module`; the loader quantizes each device's slice as it is
read (:func:`reader`, through :func:`ditax.io.convert.load_params`), so a full-precision copy
of the model never exists on a host — only one layer of one tensor at a time, for its scales.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import re
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ditax.errors import ConfigError
from ditax.nn.linear import Linear
from ditax.nn.quant_target import check_dots, describe, dots_target, native_dots

MODES = ("none", "int8", "fp8")
QMAX = {"int8": 127.0, "fp8": 448.0}
STORED = {"int8": jnp.dtype(jnp.int8), "fp8": jnp.dtype(jnp.float8_e4m3fn)}
SCALE = "kernel_scale"
#: threads that quantize a stacked kernel's layers as the loader reads them (:func:`reader`)
QUANT_THREADS = min(8, os.cpu_count() or 1)

log = logging.getLogger(__name__)


# --- the numbers --------------------------------------------------------------------------

def channel_scale(w, mode: str, axis: int = -2):
    """Per-output-channel scale ``max|w| / qmax`` over the input ``axis`` (numpy or jax;
    float32; 1 where a channel is all zeros). On jax arrays ``max |w|`` is taken in w's dtype
    (exact), so XLA reads w itself (from a float32 cast it wrote a float32 copy)."""
    xp = jnp if isinstance(w, jax.Array) else np
    amax = (jnp.max(jnp.abs(w), axis=axis).astype(jnp.float32) if xp is jnp
            else np.max(np.abs(w.astype(np.float32)), axis=axis))
    return xp.where(amax > 0, amax / QMAX[mode], 1.0).astype(xp.float32)


def quantize_values(w, scale, mode: str):
    """``w / scale`` (scale already broadcastable) in the 8-bit storage dtype of ``mode``."""
    xp = jnp if isinstance(w, jax.Array) else np
    v = w.astype(xp.float32) / scale
    if mode == "int8":
        return xp.clip(xp.round(v), -127, 127).astype(STORED[mode])
    return xp.clip(v, -448.0, 448.0).astype(STORED[mode])


def dequantize(q, scale, dtype):
    """The kernel ``q * scale`` in ``dtype`` (``scale``: the kernel without its input axis)."""
    return (q.astype(jnp.float32) * jnp.expand_dims(scale, -2)).astype(dtype)


def _place(letters: str, out: str, x):
    """``x`` (axes named ``letters``) transposed and expanded to broadcast against ``out``."""
    order = sorted(range(len(letters)), key=lambda i: out.index(letters[i]))
    x = jnp.transpose(x, order)
    shape = list(x.shape)
    have = [letters[i] for i in order]
    full = [shape[have.index(c)] if c in have else 1 for c in out]
    return x.reshape(full)


def _letters(spec: str, x_ndim: int) -> tuple[str, str, str]:
    lhs, rest = spec.split(",")
    rhs, out = rest.split("->")
    if "..." in lhs:
        free = [c for c in "ABCDEFGHIJ" if c not in spec][:x_ndim - len(lhs) + 3]
        lhs, out = lhs.replace("...", "".join(free)), out.replace("...", "".join(free))
    return lhs, rhs, out


class QuantizedInput(NamedTuple):
    """An activation quantized per token (:meth:`QuantSpec.quantize_input`): 8-bit ``values``
    (x's shape), float32 ``scale`` (x's shape without the contracted axes)."""
    values: jax.Array
    scale: jax.Array


@dataclasses.dataclass(frozen=True)
class QuantSpec:
    """How one :class:`~ditax.nn.Linear` computes: ``mode`` (int8 | fp8), ``activations``
    (quantize ``x`` per token too), ``native`` (emit the fp8 x fp8 dot; int8 x int8 is
    emitted everywhere)."""

    mode: str
    activations: bool = False
    native: bool = False

    def quantize_input(self, x, contracted: int = 1):
        """``x`` quantized per token over its last ``contracted`` axes once, for several dots
        (a layer's column chunks; :meth:`einsum` takes it as ``x``); without activations x."""
        if not self.activations:
            return x
        return self._per_token(x, tuple(range(x.ndim - contracted, x.ndim)))

    def _per_token(self, x, axes) -> "QuantizedInput":
        """``x`` in 8 bits with one scale per token (the max over the contracted ``axes``)."""
        sx = channel_scale(x, self.mode, axis=axes)
        return QuantizedInput(quantize_values(x, jnp.expand_dims(sx, axes), self.mode), sx)

    def einsum(self, spec: str, x, q, scale, dtype):
        """``einsum(spec, x, q * scale)`` in ``dtype``; ``q`` the 8-bit kernel viewed as the
        spec's right operand, ``scale`` its per-output-channel scales (any shape with the
        operand's output axes' size); ``x`` may be :meth:`quantize_input`'s result (its
        contracted axes the spec's, last)."""
        pre = x if isinstance(x, QuantizedInput) else None
        lhs, rhs, out = _letters(spec, (x if pre is None else pre.values).ndim)
        spec = f"{lhs},{rhs}->{out}"
        w_out = "".join(c for c in rhs if c in out)
        sw = _place(w_out, out, scale.reshape([q.shape[rhs.index(c)] for c in w_out]))
        if not self.activations:
            y = jnp.einsum(spec, x.astype(dtype), q.astype(dtype))
            return (y * sw.astype(dtype)).astype(dtype)
        contracted = tuple(i for i, c in enumerate(lhs) if c not in out)
        xq, sx = self._per_token(x, contracted) if pre is None else pre
        if self.mode == "int8":
            y = jnp.einsum(spec, xq, q, preferred_element_type=jnp.int32)
        elif self.native:
            y = jnp.einsum(spec, xq, q, preferred_element_type=jnp.float32)
        else:
            y = jnp.einsum(spec, xq.astype(dtype), q.astype(dtype),
                           preferred_element_type=jnp.float32)
        x_out = "".join(c for c in lhs if c in out)
        y = y.astype(jnp.float32) * _place(x_out, out, sx) * sw
        return y.astype(dtype)


# --- the model -----------------------------------------------------------------------------

def _path(path) -> tuple[str, ...]:
    return tuple(str(p) for p in path)


def quantized_linears(model, stacks, exclude=r"norm"):
    """(path, Linear) of every ``Linear`` inside the block stacks ``stacks`` (names), except
    those with a path part matching ``exclude`` (modulation: Flux's ``norm1.linear``)."""
    for path, m in nnx.iter_graph(model):
        p = _path(path)
        if (isinstance(m, Linear) and p and p[0] in stacks
                and not any(re.search(exclude, part) for part in p)):
            yield p, m


def quantize_module(model, mode: str, activations: bool = False, devices=None):
    """Give the block linears of the abstract ``model`` 8-bit kernels (``mode``) and float32
    ``kernel_scale`` s, in place; returns ``model``. ``model.block_stacks`` names the
    stacks. Values come from the loader (:func:`reader`) or a random init
    (:func:`ditax.nn.quant_random.random_kernel`). First refuses what the target (``devices``)
    cannot run well (:func:`~ditax.nn.quant_target.check_dots`)."""
    if mode == "none":
        return model
    check_dots(mode, activations, devices)
    spec = QuantSpec(mode, activations, native_dots(mode, activations, *dots_target(devices)))
    stacks = [name for name, _ in model.block_stacks]
    for _, lin in list(quantized_linears(model, stacks)):
        shape = tuple(lin.kernel.shape)
        _set(lin, spec, jax.ShapeDtypeStruct(shape, STORED[mode]),
             jax.ShapeDtypeStruct(shape[:-2] + shape[-1:], jnp.float32))
    return model


def _set(lin, spec: QuantSpec, kernel, scale) -> None:
    lin.kernel = nnx.Param(kernel)
    setattr(lin, SCALE, nnx.Param(scale))
    lin.quant = spec


def quantize_linear(lin, mode: str, activations: bool = False, native: bool = False):
    """Quantize one concrete :class:`~ditax.nn.Linear` in place from its float kernel (tests,
    benchmarks; loaded models quantize as they read, :func:`prepare`); returns ``lin``."""
    w = jnp.asarray(lin.kernel[...], jnp.float32)
    scale = channel_scale(w, mode)
    _set(lin, QuantSpec(mode, activations, native),
         quantize_values(w, jnp.expand_dims(scale, -2), mode), scale)
    return lin


def quantized_kernels(state) -> list[tuple[str, ...]]:
    """Parameter paths (strings) of the 8-bit kernels of a state (abstract or not)."""
    pure = nnx.to_pure_dict(state) if isinstance(state, nnx.State) else state
    out = []

    def walk(d, prefix):
        for k, v in d.items():
            if isinstance(v, dict):
                walk(v, prefix + (str(k),))
            elif str(k) == "kernel" and SCALE in d and jnp.dtype(v.dtype).itemsize == 1:
                out.append(prefix + (str(k),))
    walk(pure, ())
    return out


def scale_path(kernel_path: tuple[str, ...]) -> tuple[str, ...]:
    return kernel_path[:-1] + (SCALE,)


def with_scale_axes(axes: dict) -> dict:
    """A table's logical axes plus every kernel's scale's: the kernel's without the input
    axis (so scales shard over the output channels like their kernel)."""
    out = dict(axes)
    for path, names in axes.items():
        if path and path[-1] == "kernel" and len(names) >= 2:
            out[scale_path(path)] = tuple(names[:-2]) + tuple(names[-1:])
    return out


def _converter(scale, mode: str, ndim: int):
    """``convert(x, index)``: the float slice ``index`` of a kernel quantized with its rows of
    ``scale`` (the kernel's scales, numpy float32), one leading index (a stacked kernel's
    layer) at a time on up to :data:`QUANT_THREADS` threads: the float32 temporaries are a few
    layers' (whole, a Wan 14B FFN stack's were 23 GB of host memory) and the host's cores
    share the work (numpy's element-wise loops release the GIL); the values are the whole
    slice's, element for element."""
    full = (slice(None),) * ndim

    def convert(x, index):
        idx = tuple(index) + full[len(index):]
        s = np.expand_dims(scale[idx[:-2] + idx[-1:]], -2)
        x = np.asarray(x)
        if x.ndim < 3 or x.shape[0] == 1:
            return np.asarray(quantize_values(x, s, mode))
        out = np.empty(x.shape, STORED[mode])

        def one(i):
            out[i] = quantize_values(x[i], s[i], mode)

        with concurrent.futures.ThreadPoolExecutor(min(QUANT_THREADS, x.shape[0])) as pool:
            list(pool.map(one, range(x.shape[0])))
        return out

    return convert


def _scales(block, shape, stacked, mode: str) -> np.ndarray:
    """Per-output-channel scales from one float pass (a layer at a time for a stacked row)."""
    full = (slice(None),) * len(shape)
    if stacked:
        return np.concatenate([channel_scale(np.asarray(block((slice(i, i + 1),) + full[1:])),
                                             mode) for i in range(shape[0])])
    return channel_scale(np.asarray(block(full)), mode)


def reader(mode: str):
    """A quantizer for :func:`ditax.io.convert.load_params`: ``(block, shape, stacked, keys)
    -> (convert, scale)``; ``block(index)`` reads our layout's float slice of the kernel;
    ``convert(x, index)`` quantizes the slice ``index`` as each device reads it; ``scale``
    (numpy float32) from one pass over the tensor, one layer at a time for a stacked row."""
    def quantize(block, shape, stacked, keys=()):
        scale = _scales(block, shape, stacked, mode)
        return _converter(scale, mode, len(shape)), scale

    return quantize


def stored_reader(mode: str, weights):
    """:func:`reader` for a folder already stored in ``mode`` (:func:`folder_mode`): each
    kernel keeps the float32 scales stored beside it (``<key>_scale``, one per output row of
    each layer's ``keys``: ``weights.scale``), so the 8-bit values and scales load exactly as
    written (``round(fl(q·s) / s) = q``: the read is exact). Where the values read are not
    the stored ones — a LoRA merged in as they load — the scales fresh from the merged
    values are used instead (merge before quantizing), and that is logged."""
    def quantize(block, shape, stacked, keys=()):
        fresh = _scales(block, shape, stacked, mode)
        rows = [weights.scale(k) for k in keys]
        scale = fresh
        if keys and all(r is not None for r in rows):
            stored = np.stack(rows).reshape(fresh.shape)
            if np.allclose(stored, fresh, rtol=1e-6, atol=0):
                scale = stored
            else:
                log.info("quantize: %s read with new values (merged LoRA?): scales computed "
                         "again from them", keys[0])
        return _converter(scale, mode, len(shape)), scale

    return quantize


FOLDER_METHOD = "ditax"        # config.json quantization_config.quant_method of an 8-bit folder


def folder_mode(source) -> str:
    """The mode a ditax 8-bit folder (``ditax convert --quantize``) is stored in: its
    ``config.json`` ``quantization_config`` ``{"quant_method": "ditax", "weights": mode}``;
    ``"none"`` for any other checkpoint."""
    import json
    import pathlib

    cfg = pathlib.Path(source) / "config.json"
    if not cfg.is_file():
        return "none"
    qc = json.loads(cfg.read_text()).get("quantization_config") or {}
    if qc.get("quant_method") != FOLDER_METHOD:
        return "none"
    if qc.get("weights") not in STORED:
        raise ConfigError(f"{cfg}: quantization_config.weights={qc.get('weights')!r} is not a "
                          f"ditax 8-bit mode ({', '.join(STORED)}); write the folder again with "
                          f"ditax convert --quantize")
    return qc["weights"]


def prepare(model, cfg, weights, source, mesh=None) -> dict:
    """At load (``cfg`` checked by its family: :func:`ditax.models.common.fields.check_quantize`):
    refuse an 8-bit source in another format (:func:`check_source`), quantize the
    abstract ``model``'s block linears in place (:func:`quantize_module`) and return the
    kernel path → quantizer map for :func:`ditax.io.convert.load_params` ({} unquantized).
    A ditax 8-bit folder (:func:`folder_mode`) loads with its stored scales
    (:func:`stored_reader`) under ``quantize=`` its own mode, dequantized without one.
    Logs the mode and whether its dots are native 8-bit on the mesh's devices."""
    mode, act = cfg.quantize, cfg.quantize_activations
    stored = folder_mode(source)
    if stored != "none" and mode not in ("none", stored):
        raise ConfigError(f"quantize={mode!r}: {source} is a ditax {stored} folder (ditax "
                          f"convert --quantize {stored}); load it with quantize={stored!r} "
                          f"(as stored) or without quantize= (dequantized)")
    if mode == "none":
        if stored != "none":
            log.info("quantize: %s is stored in %s; loading it dequantized (quantize=%r "
                     "keeps the 8-bit weights)", source, stored, stored)
        return {}
    if stored == "none":
        check_source(weights, mode, source)
    devices = None if mesh is None else list(mesh.devices.flat)
    quantize_module(model, mode, act, devices)
    paths = quantized_kernels(nnx.state(model))
    log.info("quantize: %d block linears, %s%s", len(paths), describe(mode, act, devices),
             "" if stored == "none" else f" (stored {stored}: the folder's own scales)")
    make = reader(mode) if stored == "none" else stored_reader(mode, weights)
    return {p: make for p in paths}


def check_lora_mode(cfg, loras, lora_mode: str) -> None:
    """8-bit weights take merged LoRAs (merged into each slice before it is quantized) and
    unmerged ones (:class:`ditax.lora.unmerged.LoraLinear`: the 8-bit base dot plus the
    LoRA's low-rank update in the compute dtype): nothing to refuse (kept for the loaders'
    call; a future mode that cannot take LoRAs refuses here)."""
    del cfg, loras, lora_mode


def check_source(weights, mode: str, source) -> None:
    """Refuse ``quantize=mode`` on a checkpoint already stored in another 8-bit format
    (GGUF; int8 of fp8 tensors), from the headers only, before any tensor is read."""
    if mode == "none":
        return
    if hasattr(weights, "quant_type"):
        raise ConfigError(f"quantize={mode!r}: {source} is a GGUF file, already quantized in "
                          f"its own format; load it without quantize= (or quantize a "
                          f"full-precision checkpoint)")
    if mode == "int8":
        eight = [k for k in weights.keys() if jnp.dtype(weights.dtype(k)).itemsize == 1
                 and "float8" in str(weights.dtype(k))]
        if eight:
            raise ConfigError(f"quantize='int8': {source} is already stored in fp8 ({eight[0]} "
                              f"and {len(eight) - 1} more); load it with quantize='fp8' (kept "
                              f"in 8 bits) or without quantize=")


def weight_bytes(state) -> int:
    """Bytes of every array of a state (abstract or not), in their stored dtypes."""
    return sum(int(np.prod(x.shape)) * jnp.dtype(x.dtype).itemsize
               for x in jax.tree.leaves(state) if hasattr(x, "dtype"))


__all__ = ["MODES", "QuantSpec", "native_dots", "dots_target", "check_dots", "describe",
           "channel_scale", "quantize_values", "dequantize", "quantize_module", "quantize_linear",
           "quantized_kernels", "with_scale_axes", "reader", "stored_reader", "folder_mode",
           "prepare", "check_lora_mode", "check_source", "weight_bytes"]
