"""Options of the sampling loop that every family's pipelines take (plain data, no JAX; the
``sample`` config section reads its types from here)."""

from __future__ import annotations

from typing import Literal, get_args

# classifier-free guidance: cond + uncond in one forward of batch 2, or two forwards of batch 1
CfgMode = Literal["batched", "sequential"]
CFG_MODES = get_args(CfgMode)


def check_cfg_mode(cfg_mode) -> None:
    """The one check of a pipeline's ``cfg_mode`` (its loader, before any file is read, and
    :class:`ditax.pipelines.base.Pipeline`): a :class:`~ditax.errors.ConfigError` naming the
    value and the choices."""
    from ditax.errors import ConfigError

    if cfg_mode not in CFG_MODES:
        raise ConfigError(f"cfg_mode={cfg_mode!r} is not one of {', '.join(CFG_MODES)}")


__all__ = ["CFG_MODES", "CfgMode", "check_cfg_mode"]
