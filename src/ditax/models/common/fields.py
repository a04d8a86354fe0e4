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
import logging
from dataclasses import dataclass
from typing import Callable, ClassVar, Literal, get_args

from ditax.errors import ConfigError, check_choice

log = logging.getLogger(__name__)

DType = Literal["float32", "bfloat16", "float16"]
Remat = Literal["none", "full", "save_dots", "save_dots_no_batch", "save_attn_out",
                "save_proj", "save_proj_out"]
Quantize = Literal["none", "int8", "fp8"]   # 8-bit block weights (ditax.nn.quant)
Offload = Literal["none", "host"]           # where the stacked blocks' weights live
# what the dots and convolutions run at (jax's default_matmul_precision): "auto" = "highest"
# for a float32 model (f32 means f32: a TPU's default passes float32 through bfloat16), the
# platform's default otherwise (bfloat16 runs stay as fast)
Precision = Literal["auto", "default", "high", "highest"]
PRECISIONS = get_args(Precision)
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
    precision: Precision = "auto"    # dots / convolutions: auto = highest for float32


def check_numerics(m) -> None:
    """The rules of :class:`TransformerNumerics`' fields of model config ``m`` (a
    :class:`ConfigError` naming the ``model.`` key, its value and the choices)."""
    check_choice("model.param_dtype", m.param_dtype, DTYPES)
    check_choice("model.dtype", m.dtype, DTYPES)
    check_choice("model.remat", m.remat, REMAT_POLICIES)
    check_choice("model.offload", m.offload, OFFLOAD_MODES)
    check_choice("model.precision", getattr(m, "precision", "auto"), PRECISIONS)
    if (not isinstance(m.offload_prefetch, int) or isinstance(m.offload_prefetch, bool)
            or not 0 <= m.offload_prefetch <= MAX_PREFETCH):
        raise ConfigError(f"model.offload_prefetch={m.offload_prefetch!r}: the blocks copied "
                          f"ahead must be an int in 0..{MAX_PREFETCH} (1: the next block's "
                          f"weights arrive while this one runs)")
    check_quantize(m)


def matmul_precision(m) -> str:
    """The precision model config ``m``'s dots and convolutions run at (``model.precision``;
    ``auto``: ``highest`` for a float32 compute dtype, else ``default``), as
    :func:`jax.default_matmul_precision` names it."""
    p = getattr(m, "precision", "auto")
    if p == "auto":
        return "highest" if getattr(m, "dtype", "float32") == "float32" else "default"
    return p


def transformer_check(cls: type, check_model: Callable) -> Callable:
    """A family's ``check_transformer(m, attention=None, mesh_sizes=None)``: every rule of one
    run, in the order every family keeps — ``m`` is a ``cls`` (the family's config class),
    every number is finite and in range (:func:`ditax.numbers.check_numbers`), the family's
    ``check_model(m, mesh_sizes)`` holds, and ``attention`` (an
    :class:`~ditax.attention.config.AttentionConfig`; None: the default) runs with the
    model's heads on the mesh (``mesh_sizes``: the resolved mesh sizes; ``attention.sparsity``
    only for a config class whose ``SPARSE_ATTENTION`` is true: its module lays its tokens
    out tile-major, :mod:`ditax.attention.sparse.layout`). What an entry point
    (``ditax.validate`` through the family, the transformer loader) checks once, before
    anything is built."""
    def check_transformer(m, attention=None, mesh_sizes: dict[str, int] | None = None) -> None:
        from ditax.attention.config import AttentionConfig, check_attention
        from ditax.numbers import check_numbers

        if not isinstance(m, cls):
            raise ConfigError(f"model={m!r} is not a {cls.__name__}")
        check_numbers(m, "model.")
        check_model(m, mesh_sizes)
        attention = attention or AttentionConfig()
        check_attention(attention, num_heads=m.num_attention_heads, mesh_sizes=mesh_sizes)
        if attention.sparsity != "none" and not getattr(m, "SPARSE_ATTENTION", False):
            raise ConfigError(f"attention.sparsity={attention.sparsity} is wired for the Wan "
                              f"text-/image-to-video and VACE transformers only, not for "
                              f"{type(m).__name__}; use attention.sparsity=none")

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


class DiffusersArchitecture:
    """A config dataclass whose architecture is a diffusers ``config.json``: the class names
    its ``CLASS_NAME`` and its architecture fields ``DIFFUSERS_FIELDS`` (plain class
    attributes, not dataclass fields; ``FLOAT_FIELDS``: those a JSON integer is read as a float
    for) and gets the three readings every family's transformer config makes of them."""

    CLASS_NAME: ClassVar[str]
    DIFFUSERS_FIELDS: ClassVar[tuple[str, ...]]
    FLOAT_FIELDS: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_diffusers(cls, cfg: dict, **overrides):
        """Build from a diffusers ``config.json`` dict (keys that are no architecture field
        ignored, JSON lists as tuples); the keyword ``overrides`` (dtypes, remat …) replace
        fields (:func:`with_overrides`)."""
        kw = {k: cfg[k] for k in cls.DIFFUSERS_FIELDS if k in cfg}
        for k, v in kw.items():
            if isinstance(v, list):
                kw[k] = tuple(v)
            elif k in cls.FLOAT_FIELDS and isinstance(v, int) and not isinstance(v, bool):
                kw[k] = float(v)
        return with_overrides(cls, kw, overrides)

    def to_diffusers(self) -> dict:
        """The diffusers ``config.json`` dict of this architecture (``_class_name`` included)."""
        return diffusers_config(self, self.CLASS_NAME, self.DIFFUSERS_FIELDS)

    def same_architecture(self, other) -> list[tuple[str, object, object]]:
        """``(field, self's, other's)`` for every architecture field where they differ."""
        return [(f, getattr(self, f), getattr(other, f)) for f in self.DIFFUSERS_FIELDS
                if getattr(self, f) != getattr(other, f)]


def json_tuples(v):
    """JSON lists (nested too) as tuples, so configs compare and hash."""
    return tuple(json_tuples(x) for x in v) if isinstance(v, (list, tuple)) else v


def known_fields(cls, cfg: dict, what: str, ignored=()) -> dict:
    """The fields of the config dataclass ``cls`` a diffusers ``config.json`` dict ``cfg``
    holds, JSON lists as tuples: a component's lenient reading (VAEs, vocoder), where a key
    that is no field is logged (``what``: the config in the message) and ignored, and
    ``_``-metadata (``_class_name`` …) and ``ignored`` keys silently."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(k for k in cfg if k not in names and not k.startswith("_")
                     and k not in ignored)
    if unknown:
        log.warning("%s: ignoring unknown keys %s", what, unknown)
    return {k: json_tuples(v) for k, v in cfg.items() if k in names}


def check_positive_ints(m, names, optional=(), optional_means: str = "in_channels") -> None:
    """Every field of ``names`` of model config ``m`` is an integer >= 1, and every one of
    ``optional`` too or None (which means ``optional_means``); else a :class:`ConfigError`
    naming the ``model.`` key and its value."""
    for k in names:
        v = getattr(m, k)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"model.{k}={v!r} must be an integer >= 1")
    for k in optional:
        v = getattr(m, k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ConfigError(f"model.{k}={v!r} must be an integer >= 1 (or none: "
                              f"{optional_means})")


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
           "OFFLOAD_MODES", "MAX_PREFETCH", "Precision", "PRECISIONS", "matmul_precision", "for_training",
           "TransformerNumerics", "check_numerics", "transformer_check", "check_tensor_splits",
           "check_quantize",
           "check_overrides", "with_overrides", "diffusers_config", "DiffusersArchitecture",
           "check_positive_ints", "json_tuples", "known_fields"]
