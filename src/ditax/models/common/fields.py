"""What every family's model config shares: the numeric fields (:class:`TransformerNumerics`:
dtypes, remat, 8-bit weights, layer scan) with their rules, the dtype and remat choices (as
``Literal`` types the config loader checks), the rule for keyword overrides of a config
dataclass, the diffusers ``config.json`` a config writes, and the part of ``check_transformer``
every family runs (:func:`transformer_check`).

Light on purpose (no JAX, no flax): a family's config module imports it, and configs are read
before anything heavy loads (one exception, inside :func:`check_quantize`: fp8 activations
ask the target platform). The remat policies themselves (jax objects) are in
:mod:`ditax.nn.stack`, keyed by these names.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Literal, get_args

from ditax.errors import ConfigError, check_choice

DType = Literal["float32", "bfloat16", "float16"]
Remat = Literal["none", "full", "save_dots", "save_dots_no_batch", "save_attn_out",
                "save_proj"]
Quantize = Literal["none", "int8", "fp8"]   # 8-bit block weights (ditax.nn.quant)
Offload = Literal["none", "host"]           # where the stacked blocks' weights live
DTYPES = get_args(DType)
OFFLOAD_MODES = get_args(Offload)
MAX_PREFETCH = 8      # blocks whose weights are copied ahead (each one more block in HBM)
QUANTIZE_MODES = get_args(Quantize)
REMAT_POLICIES = get_args(Remat)


@dataclass(frozen=True)
class TransformerNumerics:
    """The fields every family's transformer config has, with one meaning and one set of rules
    (:func:`check_numerics`): how the weights are stored and computed, checkpointed and
    scanned. ditax's own: a diffusers ``config.json`` does not hold them.

    A family's config lists it between its architecture fields and its own extras, so the
    config keys keep their order (a dataclass orders its fields from the last base to the
    class itself): ``class WanConfig(TransformerNumerics, WanShape)`` has ``WanShape``'s
    fields, these, then its own.
    """

    param_dtype: DType = "float32"   # storage dtype of the weights
    dtype: DType = "float32"         # compute dtype of matmuls / attention
    remat: Remat = "none"            # activation checkpointing policy of each block
    quantize: Quantize = "none"      # block linears' weights in 8 bits (ditax.nn.quant)
    quantize_activations: bool = False   # and their inputs per token (8-bit x 8-bit dots)
    scan_layers: bool = True
    offload: Offload = "none"        # host: the blocks' weights streamed from host memory
    offload_prefetch: int = 1        # blocks copied ahead while one runs (forward programs)


def check_numerics(m) -> None:
    """The rules of :class:`TransformerNumerics`' fields of model config ``m`` (a
    :class:`ConfigError` naming the ``model.`` key, its value and the choices)."""
    check_choice("model.param_dtype", m.param_dtype, DTYPES)
    check_choice("model.dtype", m.dtype, DTYPES)
    check_choice("model.remat", m.remat, REMAT_POLICIES)
    check_choice("model.offload", m.offload, OFFLOAD_MODES)
    if (not isinstance(m.offload_prefetch, int) or isinstance(m.offload_prefetch, bool)
            or not 0 <= m.offload_prefetch <= MAX_PREFETCH):
        raise ConfigError(f"model.offload_prefetch={m.offload_prefetch!r}: the blocks copied "
                          f"ahead must be an int in 0..{MAX_PREFETCH} (1: the next block's "
                          f"weights arrive while this one runs)")
    check_quantize(m)


def transformer_check(cls: type, check_model: Callable) -> Callable:
    """A family's ``check_transformer(m, attention=None, mesh_sizes=None)``: every rule of one
    run, in the order every family keeps — ``m`` is a ``cls`` (the family's config class),
    every number is finite and in range (:func:`ditax.numbers.check_numbers`), the family's
    ``check_model(m, mesh_sizes)`` holds, and ``attention`` (an
    :class:`~ditax.attention.config.AttentionConfig`; None: the default) runs with the
    model's heads on the mesh (``mesh_sizes``: the resolved mesh sizes). What an entry point
    (``ditax.validate`` through the family, the transformer loader) checks once, before
    anything is built."""
    def check_transformer(m, attention=None, mesh_sizes: dict[str, int] | None = None) -> None:
        from ditax.attention.config import AttentionConfig, check_attention
        from ditax.numbers import check_numbers

        if not isinstance(m, cls):
            raise ConfigError(f"model={m!r} is not a {cls.__name__}")
        check_numbers(m, "model.")
        check_model(m, mesh_sizes)
        check_attention(attention or AttentionConfig(), num_heads=m.num_attention_heads,
                        mesh_sizes=mesh_sizes)

    check_transformer.__doc__ = (f"Every rule of one {cls.__name__} run, checked once at the "
                                 f"entry point (:func:`ditax.models.common.fields.transformer_check`).")
    return check_transformer


def check_tensor_splits(m, mesh_sizes: dict[str, int] | None, mlp_width: int,
                        mlp_key: str) -> None:
    """With a mesh (``mesh_sizes``: its resolved sizes), the heads of ``m`` and its MLP
    width (``mlp_width``, named ``mlp_key`` in the message) split evenly over
    ``mesh.tensor``."""
    if mesh_sizes is None:
        return
    from ditax.parallel.mesh import check_tensor_split

    check_tensor_split(m.num_attention_heads, mesh_sizes, "model.num_attention_heads")
    check_tensor_split(mlp_width, mesh_sizes, mlp_key)


def with_overrides(cls, kw: dict, overrides: dict):
    """``cls(**kw)`` with the keyword ``overrides`` (dtypes, remat …) replacing ``kw``'s
    values, each checked to be a field first (:func:`check_overrides`)."""
    check_overrides(cls, overrides)
    return cls(**{**kw, **overrides})


def diffusers_config(m, class_name: str, names) -> dict:
    """The diffusers ``config.json`` dict of ``m``'s architecture: ``_class_name`` and the
    fields ``names`` (tuples as JSON lists); the numerics are ditax's own, not written."""
    out = {"_class_name": class_name}
    for f in names:
        v = getattr(m, f)
        out[f] = list(v) if isinstance(v, tuple) else v
    return out


def for_training(m):
    """``m`` as a training program runs it: with offloaded weights each block's copy in its
    own step (``offload_prefetch=0``), since a scan's carried copies would be kept for the
    backward pass (every block's weights in device memory)."""
    if getattr(m, "offload", "none") == "host" and m.offload_prefetch:
        return dataclasses.replace(m, offload_prefetch=0)
    return m


def check_quantize(m) -> None:
    """``m.quantize`` is a mode of :data:`QUANTIZE_MODES`; ``m.quantize_activations`` needs
    one (a :class:`ConfigError` naming the value and the fix); fp8 activations need fp8
    matrix units where the target is a TPU (:func:`ditax.nn.quant_target.check_dots`), the
    one rule that asks JAX (the platform), so JAX is imported for it alone."""
    if m.quantize not in QUANTIZE_MODES:
        raise ConfigError(f"model.quantize={m.quantize!r} is not a quantization mode; use one "
                          f"of {', '.join(QUANTIZE_MODES)} (e.g. model.quantize=int8, or "
                          f"quantize='int8' in ditax.load_transformer)")
    if m.quantize_activations and m.quantize == "none":
        raise ConfigError("model.quantize_activations=true needs 8-bit weights: set "
                          "model.quantize=int8 or model.quantize=fp8")
    if m.quantize == "fp8" and m.quantize_activations:
        from ditax.nn.quant_target import check_dots

        check_dots(m.quantize, m.quantize_activations)


def check_overrides(cls, overrides: dict) -> None:
    """Every keyword in ``overrides`` is a field of the config dataclass ``cls``; else a
    :class:`ConfigError` with a did-you-mean (not the dataclass's ``TypeError``)."""
    import difflib

    names = [f.name for f in dataclasses.fields(cls)]
    for key in overrides:
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{key}={overrides[key]!r} is no {cls.__name__} field{hint} "
                              f"(fields: {', '.join(names)})")


__all__ = ["DType", "Remat", "Quantize", "Offload", "DTYPES", "REMAT_POLICIES", "QUANTIZE_MODES",
           "OFFLOAD_MODES", "MAX_PREFETCH", "for_training",
           "TransformerNumerics", "check_numerics", "transformer_check", "check_tensor_splits",
           "check_quantize",
           "check_overrides", "with_overrides", "diffusers_config"]
