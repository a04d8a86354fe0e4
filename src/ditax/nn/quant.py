"""8-bit weights (and optionally activations) for :class:`ditax.nn.Linear`, post-training.

A quantized ``Linear`` stores its kernel in 8 bits — ``int8`` (symmetric, ``q = round(w /
s)``, ``|q| <= 127``) or ``float8_e4m3fn`` (``q = fp8(w / s)``, ``|q| <= 448``) — with one
float32 scale per output channel, ``kernel_scale`` (the kernel's shape without its input axis,
the second-to-last one in both layouts: ``[..., in, out] -> [..., out]``, head-major ``[..., N,
in, K] -> [..., N, K]``), sharded like the kernel without that axis. ``s = max|w| / qmax``
over the input axis, so no calibration data is needed.

The dot (:meth:`QuantSpec.einsum`) and the numbers live in :mod:`ditax.nn.quant_dot`: weights
only, ``(x @ q) * s`` in the compute dtype; with activations ``x`` quantized per token too and
``int8 x int8 -> int32`` (``fp8 x fp8`` where the platform has fp8 dots,
:func:`~ditax.nn.quant_target.native_dots`; refused on a TPU without fp8 matrix units,
:func:`~ditax.nn.quant_target.check_dots`), both scales applied to the result.

Quantization is a property of the module (``Linear.quant``, static in the graph), set on the
abstract model by :func:`quantize_module`; the loader quantizes each device's slice as it is
read (:func:`reader`, through :func:`ditax.io.convert.load_params`), so a full-precision copy
of the model never exists on a host — only one layer of one tensor at a time, for its scales.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ditax.errors import ConfigError
from ditax.nn.linear import Linear
from ditax.nn.quant_dot import (MODES, QMAX, STORED, QuantizedInput, QuantizedParts,
                                QuantSpec, channel_scale, dequantize, quantize_values)
from ditax.nn.quant_target import check_dots, describe, dots_target, native_dots

SCALE = "kernel_scale"
#: threads that quantize a stacked kernel's layers as the loader reads them (:func:`reader`)
QUANT_THREADS = min(8, os.cpu_count() or 1)

log = logging.getLogger(__name__)


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


__all__ = ["MODES", "QMAX", "STORED", "QuantSpec", "QuantizedInput", "QuantizedParts",
           "native_dots", "dots_target", "check_dots", "describe",
           "channel_scale", "quantize_values", "dequantize", "quantize_module", "quantize_linear",
           "quantized_kernels", "with_scale_axes", "reader", "stored_reader", "folder_mode",
           "prepare", "check_lora_mode", "check_source", "weight_bytes"]
