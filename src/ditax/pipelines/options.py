"""Options of the sampling loop that every family's pipelines take (plain data, no JAX; the
``sample`` config section reads its types from here)."""

from __future__ import annotations

from typing import Literal, get_args

# classifier-free guidance: cond + uncond in one forward of batch 2, or two forwards of batch 1
CfgMode = Literal["batched", "sequential"]
CFG_MODES = get_args(CfgMode)

__all__ = ["CFG_MODES", "CfgMode"]
