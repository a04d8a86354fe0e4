"""The checks of a FLUX.2 request that need no model: one
:class:`~ditax.errors.RequestError` line naming the value and the fix.

Which guidance a folder runs is its kind's (:data:`KINDS`): ``dev`` (``Flux2Pipeline``) embeds
``guidance_scale`` in the transformer and runs one forward a step; klein *distilled*
(``Flux2KleinPipeline`` with ``is_distilled``) takes no guidance at all; klein *base* runs true
CFG against ``negative_prompt`` (default ``""``, as diffusers) when ``guidance_scale > 1``.
diffusers ignores a guidance scale a distilled folder cannot use (a warning); here it is
refused, as is a negative prompt that no CFG branch would read.
"""

from __future__ import annotations

import math
import numbers

from ditax.errors import RequestError
from ditax.pipelines.request import check_prompt

GRID = 16                 # FLUX.2: the VAE's 8x and the 2x2 patch
DEFAULT_GUIDANCE = 4.0    # diffusers' default for dev and klein base
DISTILLED_GUIDANCE = 1.0  # a distilled klein's: none
DEV, KLEIN_BASE, KLEIN_DISTILLED = "dev", "klein-base", "klein-distilled"
KINDS = (DEV, KLEIN_BASE, KLEIN_DISTILLED)


def check_size(grid: int, **sizes) -> None:
    """Every size given (``height=``, ``width=``; None: not given) is a positive multiple of
    ``grid`` (the VAE's factor x the 2x2 patch). diffusers rounds a size down with a warning;
    here it is refused, naming the nearest size that fits."""
    for name, v in sizes.items():
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < grid or v % grid:
            near = max(grid, round(v / grid) * grid) if isinstance(v, int) else 1024
            raise RequestError(f"{name}={v!r} must be a positive multiple of {grid} (the VAE's "
                               f"{grid // 2}x and the 2x2 patch); e.g. {near}")


def guidance_for(kind: str, guidance_scale) -> float:
    """The guidance scale a call of a ``kind`` folder runs: the given one, else the kind's
    default (4 for dev and klein base, none for a distilled klein)."""
    if guidance_scale is not None:
        return guidance_scale
    return DISTILLED_GUIDANCE if kind == KLEIN_DISTILLED else DEFAULT_GUIDANCE


def check_guidance(kind: str | None, guidance_scale, negative_prompt) -> None:
    """The guidance and negative prompt fit the folder's ``kind`` (module docstring; None: not
    known yet, only the value is checked)."""
    g = guidance_scale
    if g is not None and (isinstance(g, bool) or not isinstance(g, numbers.Real)
                          or not math.isfinite(g) or g < 0):
        raise RequestError(f"guidance_scale={g!r} must be a finite number >= 0 (FLUX.2 dev and "
                           f"klein base: 4; a distilled klein: none)")
    if negative_prompt is not None and not isinstance(negative_prompt, str):
        raise RequestError(f"negative_prompt must be one string; got "
                           f"{type(negative_prompt).__name__}")
    if kind == KLEIN_DISTILLED and g is not None and g > 1:
        raise RequestError(f"guidance_scale={g}: this klein folder is step-distilled "
                           f"(model_index.json is_distilled), it runs without guidance; drop "
                           f"it (or pass 1)")
    if negative_prompt is None or kind is None:
        return
    if kind == DEV:
        raise RequestError("negative_prompt: FLUX.2 dev is guidance-distilled (its guidance is "
                           "embedded, one forward a step), it reads no negative prompt; drop it")
    if kind == KLEIN_DISTILLED:
        raise RequestError("negative_prompt: this klein folder is step-distilled and runs no "
                           "CFG; drop it")
    if guidance_for(kind, g) <= 1:
        raise RequestError(f"negative_prompt is read only with CFG; set guidance_scale > 1 "
                           f"(e.g. 4) or drop it (guidance_scale={g})")


def check_steps(num_inference_steps) -> None:
    n = num_inference_steps
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise RequestError(f"num_inference_steps={n!r} must be a positive int (FLUX.2: 50; a "
                           f"distilled klein: 4)")


def check_text_length(max_sequence_length, most: int | None = None) -> None:
    """A text length of 1 .. ``most`` tokens (None: no upper bound known here)."""
    m = max_sequence_length
    if isinstance(m, bool) or not isinstance(m, int) or m < 1 or (most is not None
                                                                   and m > most):
        span = f"1..{most}" if most is not None else ">= 1"
        raise RequestError(f"max_sequence_length={m!r} must be an int in {span} (text tokens; "
                           f"FLUX.2: 512)")


def check_request(prompt, height, width, num_inference_steps, guidance_scale,
                  negative_prompt=None, max_sequence_length=512, seed=0,
                  kind: str | None = None, grid: int | None = GRID) -> None:
    """Raise :class:`RequestError` for a request no FLUX.2 folder of ``kind`` takes (None:
    any kind). ``grid``: the size grid (None: left to the folder's check, which reads its
    VAE's factor); sizes None: not given (the first reference image's, else the default)."""
    if not isinstance(prompt, str):
        raise RequestError(f"prompt must be one string; got {type(prompt).__name__}")
    check_prompt(prompt)
    if grid is not None:
        check_size(grid, height=height, width=width)
    check_steps(num_inference_steps)
    check_guidance(kind, guidance_scale, negative_prompt)
    check_text_length(max_sequence_length)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 32:
        raise RequestError(f"seed={seed!r} must be an int in [0, 2**32)")


__all__ = ["DEFAULT_GUIDANCE", "DEV", "DISTILLED_GUIDANCE", "GRID", "KINDS", "KLEIN_BASE",
           "KLEIN_DISTILLED", "check_guidance", "check_request", "check_size", "check_steps",
           "check_text_length", "guidance_for"]
