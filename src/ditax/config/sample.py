"""The ``sample`` section: defaults for ``ditax generate`` (sizes, steps, guidance, sampler)
and its rules. Request-level checks (sizes against the VAE / patch grid) live with the
pipeline (:func:`ditax.pipelines.text_to_video.check_request`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional, get_args

from ditax.errors import ConfigError, check_choice

CfgMode = Literal["batched", "sequential"]
Sampler = Literal["unipc", "euler"]
CFG_MODES = get_args(CfgMode)
SAMPLERS = get_args(Sampler)


@dataclass(frozen=True)
class SampleConfig:
    height: int = 480
    width: int = 832
    num_frames: int = 81
    num_inference_steps: int = 50
    guidance_scale: float = 5.0
    guidance_scale_2: Optional[float] = None
    cfg_mode: CfgMode = "batched"       # cond + uncond in one forward of batch 2, or two
    scheduler: Sampler = "unipc"
    flow_shift: Optional[float] = None  # None = from the scheduler config
    max_sequence_length: int = 512
    vae_tiling: bool = False


def check_sample(s: SampleConfig) -> None:
    """Raise :class:`ConfigError` for sampling defaults that cannot run."""
    check_choice("sample.cfg_mode", s.cfg_mode, CFG_MODES)
    check_choice("sample.scheduler", s.scheduler, SAMPLERS)
    if s.flow_shift is not None and s.flow_shift <= 0:
        raise ConfigError(f"sample.flow_shift={s.flow_shift} must be > 0 (or none)")
    if s.max_sequence_length < 1:
        raise ConfigError(f"sample.max_sequence_length={s.max_sequence_length} must be >= 1")


__all__ = ["SampleConfig", "check_sample", "CFG_MODES", "SAMPLERS"]
