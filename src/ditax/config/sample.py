"""The ``sample`` section: defaults for ``ditax generate`` (sizes, steps, guidance, sampler)
and its rules. Request-level checks (sizes against the VAE / patch grid) live with the
pipeline (:func:`ditax.pipelines.wan.text_to_video.check_request`).

``sample.preset`` names a bundle of sampling settings (:data:`SAMPLE_PRESETS`) that the config
loader writes into the section: over a YAML file's values, under the ``key=value`` overrides
given beside it. ``lightning-4step`` is the schedule the 4-step distillation LoRAs (LightX2V,
Wan 2.1 / 2.2 "Lightning") were distilled on: Euler on the flow sigmas 1, 0.75, 0.5, 0.25
shifted by 5 — timesteps 1000, 937.5, 833.3, 625 — without classifier-free guidance (on Wan 2.2
A14B the boundary 875 gives each expert two steps)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Optional, get_args

from ditax.errors import ConfigError, check_choice

CfgMode = Literal["batched", "sequential"]
Sampler = Literal["unipc", "euler"]
SamplePreset = Literal["lightning-4step"]
StepCacheMethod = Literal["first_block", "teacache", "magcache"]
CFG_MODES = get_args(CfgMode)
SAMPLERS = get_args(Sampler)
CACHE_METHODS = get_args(StepCacheMethod)

# preset name -> the sample fields it sets
SAMPLE_PRESETS: dict[str, dict[str, Any]] = {
    "lightning-4step": dict(num_inference_steps=4, guidance_scale=1.0, scheduler="euler",
                            flow_shift=5.0, sigmas=(1.0, 0.75, 0.5, 0.25)),
}


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
    # the Euler sampler's sigmas before the shift, one per step (None = evenly spaced)
    sigmas: Optional[tuple[float, ...]] = None
    preset: Optional[SamplePreset] = None  # a bundle of the fields above (SAMPLE_PRESETS)

    # step caching (ditax.pipelines.step_cache): none | first_block | teacache | magcache
    cache: Optional[StepCacheMethod] = None
    cache_threshold: Optional[float] = None  # None = the method's default; larger skips more
    cfg_cache: bool = False                  # reuse the unconditional branch on low-noise steps
    cache_coefficients: Optional[str] = None  # numbers file of `ditax calibrate-cache`


def expand_preset(flat: dict[str, Any], explicit) -> dict[str, Any]:
    """Dotted config values with ``sample.preset``'s fields written in, except the keys in
    ``explicit`` (the overrides the user gave, which win). Unknown names raise."""
    name = flat.get("sample.preset")
    if name is None or str(name).strip().lower() in ("none", "null", "~"):
        return flat
    check_choice("sample.preset", name, tuple(SAMPLE_PRESETS))
    out = dict(flat)
    for k, v in SAMPLE_PRESETS[name].items():
        if f"sample.{k}" not in explicit:
            out[f"sample.{k}"] = v
    return out


def check_sample(s: SampleConfig) -> None:
    """Raise :class:`ConfigError` for sampling defaults that cannot run."""
    check_choice("sample.cfg_mode", s.cfg_mode, CFG_MODES)
    check_choice("sample.scheduler", s.scheduler, SAMPLERS)
    if s.flow_shift is not None and s.flow_shift <= 0:
        raise ConfigError(f"sample.flow_shift={s.flow_shift} must be > 0 (or none)")
    if s.max_sequence_length < 1:
        raise ConfigError(f"sample.max_sequence_length={s.max_sequence_length} must be >= 1")
    if s.preset is not None:
        check_choice("sample.preset", s.preset, tuple(SAMPLE_PRESETS))
    if s.sigmas is not None:
        if s.scheduler != "euler":
            raise ConfigError(f"sample.sigmas is for the Euler sampler; set sample.scheduler=euler "
                              f"(it is {s.scheduler}) or sample.sigmas=none")
        from ditax.schedulers.flow_match import check_sigmas

        try:
            check_sigmas(s.sigmas, s.num_inference_steps)
        except ValueError as e:
            raise ConfigError(f"sample.sigmas: {e}") from None
    if s.cache is not None:
        check_choice("sample.cache", s.cache, CACHE_METHODS)
    if s.cache_threshold is not None:
        if s.cache is None:
            raise ConfigError(f"sample.cache_threshold={s.cache_threshold} needs sample.cache "
                              f"({', '.join(CACHE_METHODS)}); set it or drop the threshold")
        if not s.cache_threshold >= 0 or s.cache_threshold == float("inf"):
            raise ConfigError(f"sample.cache_threshold={s.cache_threshold} must be a number "
                              f">= 0 (or none for the method's default)")


__all__ = ["SampleConfig", "check_sample", "expand_preset", "CACHE_METHODS", "CFG_MODES",
           "SAMPLERS", "SAMPLE_PRESETS"]
