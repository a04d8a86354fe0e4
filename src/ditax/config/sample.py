"""The ``sample`` section: defaults for ``ditax generate`` (sizes, steps, guidance, sampler)
and its rules. Request-level checks (sizes against the VAE / patch grid) live with the
family's pipelines (:meth:`ditax.pipelines.family.PipelineFamily.check_request`).

The sizes, frames, steps, guidance and text tokens default to the default family's sample
defaults (:func:`ditax.pipelines.family.sample_defaults`; Wan's: 480x832, 81 frames, 50 steps,
guidance 5, in :mod:`ditax.pipelines.wan.defaults`): this package writes none of them.

``sample.preset`` names a bundle of sampling settings that the config loader writes into the
section: over a YAML file's values, under the ``key=value`` overrides given beside it. The
bundles are the model family's (:func:`ditax.pipelines.family.sample_presets`; Wan's
``lightning-4step``, the schedule of the 4-step distillation LoRAs)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Optional, get_args

from ditax.errors import ConfigError, check_choice
from ditax.models.registry import DEFAULT_FAMILY
from ditax.pipelines.family import sample_defaults, sample_presets
from ditax.pipelines.options import CFG_MODES, CfgMode

Sampler = Literal["unipc", "euler"]
StepCacheMethod = Literal["first_block", "teacache", "magcache"]
SAMPLERS = get_args(Sampler)
CACHE_METHODS = get_args(StepCacheMethod)

_D = sample_defaults(DEFAULT_FAMILY)   # the default family's (Wan's) call defaults


@dataclass(frozen=True)
class SampleConfig:
    height: int = _D["height"]
    width: int = _D["width"]
    num_frames: int = _D["num_frames"]
    num_inference_steps: int = _D["num_inference_steps"]
    guidance_scale: float = _D["guidance_scale"]
    guidance_scale_2: Optional[float] = _D["guidance_scale_2"]
    cfg_mode: CfgMode = "batched"       # cond + uncond in one forward of batch 2, or two
    scheduler: Sampler = "unipc"
    flow_shift: Optional[float] = None  # None = from the scheduler config
    max_sequence_length: int = _D["max_sequence_length"]
    # decode in spatial tiles; not given: whole, or in tiles where a chip's memory plan says the
    # whole Wan decode does not fit (one warning line; ditax.pipelines.decode_fit)
    vae_tiling: bool = False
    vae_parallel: bool = False          # decode with each frame's rows split over the mesh
    # the Euler sampler's sigmas before the shift, one per step (None = evenly spaced)
    sigmas: Optional[tuple[float, ...]] = None
    preset: Optional[str] = None  # a bundle of the fields above (the family's sample presets)

    # step caching (ditax.pipelines.cache.step_cache): none | first_block | teacache | magcache
    cache: Optional[StepCacheMethod] = None
    cache_threshold: Optional[float] = None  # None = the method's default; larger skips more
    cfg_cache: bool = False                  # reuse the unconditional branch on low-noise steps
    cache_coefficients: Optional[str] = None  # numbers file of `ditax calibrate-cache`
    # a causal model (model.causal_chunk): chunks its KV cache keeps beside the sink chunk
    # (a rolling window for long videos); None = every earlier chunk
    context_chunks: Optional[int] = None


def expand_preset(flat: dict[str, Any], explicit) -> dict[str, Any]:
    """Dotted config values with ``sample.preset``'s fields written in, except the keys in
    ``explicit`` (the overrides the user gave, which win). The presets are those of the
    config's family (``model.family``); unknown names raise."""
    name = flat.get("sample.preset")
    if name is None or str(name).strip().lower() in ("none", "null", "~"):
        return flat
    presets = sample_presets(str(flat.get("model.family", DEFAULT_FAMILY)).strip())
    check_choice("sample.preset", name, tuple(presets))
    out = dict(flat)
    for k, v in presets[name].items():
        if f"sample.{k}" not in explicit:
            out[f"sample.{k}"] = v
    return out


def check_sample(s: SampleConfig, family: str = DEFAULT_FAMILY) -> None:
    """Raise :class:`ConfigError` for sampling defaults that cannot run (``family``: the
    config's model family, whose presets ``sample.preset`` names)."""
    check_choice("sample.cfg_mode", s.cfg_mode, CFG_MODES)
    check_choice("sample.scheduler", s.scheduler, SAMPLERS)
    if s.flow_shift is not None and s.flow_shift <= 0:
        raise ConfigError(f"sample.flow_shift={s.flow_shift} must be > 0 (or none)")
    if s.max_sequence_length < 1:
        raise ConfigError(f"sample.max_sequence_length={s.max_sequence_length} must be >= 1")
    if s.preset is not None:
        check_choice("sample.preset", s.preset, tuple(sample_presets(family)))
    if s.sigmas is not None:
        if s.scheduler != "euler":
            raise ConfigError(f"sample.sigmas is for the Euler sampler; set sample.scheduler=euler "
                              f"(it is {s.scheduler}) or sample.sigmas=none")
        from ditax.schedulers.flow_match import check_sigmas

        try:
            check_sigmas(s.sigmas, s.num_inference_steps)
        except ValueError as e:
            raise ConfigError(f"sample.sigmas: {e}") from None
    if s.context_chunks is not None and (isinstance(s.context_chunks, bool) or
                                         s.context_chunks < 1):
        raise ConfigError(f"sample.context_chunks={s.context_chunks} must be >= 1 (chunks the "
                          f"KV cache keeps beside the sink chunk) or none (every earlier chunk)")
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
           "SAMPLERS"]
