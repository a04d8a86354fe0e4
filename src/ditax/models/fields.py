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
Remat = Literal["none", "full", "save_dots", "save_dots_no_batch", "save_attn_out"]
DTYPES = get_args(DType)
REMAT_POLICIES = get_args(Remat)


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


__all__ = ["DType", "Remat", "DTYPES", "REMAT_POLICIES", "check_overrides"]
