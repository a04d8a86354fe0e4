"""What every family's model config shares: the dtype and remat choices (as ``Literal`` types
the config loader checks) and the rule for keyword overrides of a config dataclass.

Light on purpose (no JAX, no flax): a family's config module imports it, and configs are read
before anything heavy loads. The remat policies themselves (jax objects) are in
:mod:`ditax.nn.stack`, keyed by these names.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, get_args

from ditax.errors import ConfigError

DType = Literal["float32", "bfloat16", "float16"]
Remat = Literal["none", "full", "save_dots", "save_dots_no_batch", "save_attn_out",
                "save_proj"]
Quantize = Literal["none", "int8", "fp8"]   # 8-bit block weights (ditax.nn.quant)
DTYPES = get_args(DType)
QUANTIZE_MODES = get_args(Quantize)
REMAT_POLICIES = get_args(Remat)


def check_quantize(m) -> None:
    """``m.quantize`` is a mode of :data:`QUANTIZE_MODES`; ``m.quantize_activations`` needs
    one (a :class:`ConfigError` naming the value and the fix)."""
    if m.quantize not in QUANTIZE_MODES:
        raise ConfigError(f"model.quantize={m.quantize!r} is not a quantization mode; use one "
                          f"of {', '.join(QUANTIZE_MODES)} (e.g. model.quantize=int8, or "
                          f"quantize='int8' in ditax.load_transformer)")
    if m.quantize_activations and m.quantize == "none":
        raise ConfigError("model.quantize_activations=true needs 8-bit weights: set "
                          "model.quantize=int8 or model.quantize=fp8")


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


__all__ = ["DType", "Remat", "Quantize", "DTYPES", "REMAT_POLICIES", "QUANTIZE_MODES",
           "check_quantize", "check_overrides"]
