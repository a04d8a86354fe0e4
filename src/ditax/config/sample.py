"""The ``sample`` section: defaults for ``ditax generate`` (sizes, steps, guidance, sampler)
and its rules. Request-level checks (sizes against the VAE / patch grid) live with the
pipeline (:func:`ditax.pipelines.text_to_video.check_request`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional, get_args

from ditax.errors import ConfigError, check_choice

CfgMode = Literal["batched", "sequential"]
Sampler = Literal["unipc", "euler"]
StepCacheMethod = Literal["first_block", "teacache", "magcache"]
CFG_MODES = get_args(CfgMode)
SAMPLERS = get_args(Sampler)
CACHE_METHODS = get_args(StepCacheMethod)


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
    # step caching (ditax.pipelines.step_cache): none | first_block | teacache | magcache
    cache: Optional[StepCacheMethod] = None
    cache_threshold: Optional[float] = None  # None = the method's default; larger skips more
    cfg_cache: bool = False                  # reuse the unconditional branch on low-noise steps
    cache_coefficients: Optional[str] = None  # numbers file of `ditax calibrate-cache`


def check_sample(s: SampleConfig) -> None:
    """Raise :class:`ConfigError` for sampling defaults that cannot run."""
    check_choice("sample.cfg_mode", s.cfg_mode, CFG_MODES)
    check_choice("sample.scheduler", s.scheduler, SAMPLERS)
    if s.flow_shift is not None and s.flow_shift <= 0:
        raise ConfigError(f"sample.flow_shift={s.flow_shift} must be > 0 (or none)")
    if s.max_sequence_length < 1:
        raise ConfigError(f"sample.max_sequence_length={s.max_sequence_length} must be >= 1")
    if s.cache is not None:
        check_choice("sample.cache", s.cache, CACHE_METHODS)
    if s.cache_threshold is not None:
        if s.cache is None:
            raise ConfigError(f"sample.cache_threshold={s.cache_threshold} needs sample.cache "
                              f"({', '.join(CACHE_METHODS)}); set it or drop the threshold")
        if not s.cache_threshold >= 0 or s.cache_threshold == float("inf"):
            raise ConfigError(f"sample.cache_threshold={s.cache_threshold} must be a number "
                              f">= 0 (or none for the method's default)")


__all__ = ["SampleConfig", "check_sample", "CACHE_METHODS", "CFG_MODES", "SAMPLERS"]
