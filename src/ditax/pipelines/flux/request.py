"""The checks of a FLUX.1 text-to-image request that need no model: one
:class:`~ditax.errors.RequestError` line naming the value and the fix."""

from __future__ import annotations

import math
import numbers

from ditax.errors import RequestError
from ditax.pipelines.request import check_prompt

FACTOR = 16          # FLUX.1: the VAE's 8x and the 2x2 token packing
MAX_TEXT_TOKENS = 512


def check_size(factor: int, **sizes) -> None:
    """Raise :class:`RequestError` unless every size given (``height=``, ``width=``) is a
    positive multiple of ``factor`` (the VAE's spatial factor times the 2x2 token packing)."""
    for name, v in sizes.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < factor or v % factor:
            near = max(factor, round(v / factor) * factor) if isinstance(v, int) else 1024
            raise RequestError(f"{name}={v!r} must be a positive multiple of {factor} (the VAE's "
                               f"{factor // 2}x and the 2x2 token packing); e.g. {near}")


def check_request(prompt, prompt_2, height, width, num_inference_steps, guidance_scale,
                  negative_prompt, true_cfg_scale, max_sequence_length, seed,
                  factor: int | None = FACTOR) -> None:
    """Raise :class:`RequestError` for a request no FLUX.1 folder takes. ``factor``: the size
    grid (:func:`check_size`); None leaves it to the folder's check (a Flux VAE may have
    fewer levels than FLUX.1's: ``PipelineFamily.preflight`` reads its factor)."""
    for name, p in (("prompt", prompt), ("prompt_2", prompt_2),
                    ("negative_prompt", negative_prompt)):
        if p is not None and not isinstance(p, str) or (name == "prompt" and p is None):
            raise RequestError(f"{name} must be one string; got {type(p).__name__}")
    check_prompt(prompt)
    if factor is not None:
        check_size(factor, height=height, width=width)
    if isinstance(num_inference_steps, bool) or not isinstance(num_inference_steps, int) \
            or num_inference_steps < 1:
        raise RequestError(f"num_inference_steps={num_inference_steps!r} must be a positive int "
                           f"(dev: 28, schnell: 4)")
    for name, v in (("guidance_scale", guidance_scale), ("true_cfg_scale", true_cfg_scale)):
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) \
                or v < 0:
            raise RequestError(f"{name}={v!r} must be a finite number >= 0 (FLUX.1-dev: "
                               f"guidance 3.5; true CFG off: 1)")
    if true_cfg_scale > 1 and negative_prompt is None:
        raise RequestError(f"true_cfg_scale={true_cfg_scale} runs true CFG against a negative "
                           f"prompt; pass negative_prompt= (or set true_cfg_scale=1)")
    if negative_prompt is not None and true_cfg_scale <= 1:
        raise RequestError(f"negative_prompt is used only with true CFG; set true_cfg_scale > 1 "
                           f"(e.g. 4.0) or drop it (true_cfg_scale={true_cfg_scale})")
    if (not isinstance(max_sequence_length, int)
            or not 1 <= max_sequence_length <= MAX_TEXT_TOKENS):
        raise RequestError(f"max_sequence_length={max_sequence_length!r} must be an int in "
                           f"1..{MAX_TEXT_TOKENS} (T5 text tokens; schnell uses 256)")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 32:
        raise RequestError(f"seed={seed!r} must be an int in [0, 2**32)")


__all__ = ["FACTOR", "MAX_TEXT_TOKENS", "check_request", "check_size"]
