"""Measure a model's step-cache numbers (``ditax calibrate-cache``): TeaCache's polynomial and
MagCache's per-step magnitude ratios, from uncached generations of a few prompts.

Each prompt is generated with every step computed (``cache="calibrate"`` in the pipeline: the
plain computation, plus per-step measurements taken on the device, per CFG branch):

- ``m_modulation`` / ``m_time_embedding``: relative L1 change of the blocks' modulation
  ``[B, 6, D]`` / the time embedding ``[B, D]`` since the previous step (TeaCache's input);
- ``m_output``: relative L1 change of the transformer output since the previous step;
- ``m_ratio``: mean over tokens of ``|r_t| / |r_{t-1}|``, ``r`` the blocks' residual (MagCache).

TeaCache's polynomial is the least-squares fit (``numpy.polyfit``, degree 4 as published, less
when there are fewer distinct points) of the output change on the input change over every step
> 0, prompt and branch (a family's extra guidance branches, LTX-2's, included); MagCache's
ratios are the per-step means over prompts, per CFG branch (without guidance the one branch's
ratios serve both). Retention and K are the published
methods' (TeaCache: the first 10 % of steps always run; MagCache: the first 20 %, K = 2).
The result is one numbers entry (:mod:`.numbers`) for this model.
"""

from __future__ import annotations

import numpy as np

from ditax.pipelines.cache.numbers import match_of
from ditax.pipelines.cache.policy import CALIBRATE

TEACACHE_DEGREE = 4
TEACACHE_RETENTION = 0.1
MAGCACHE_RETENTION = 0.2
MAGCACHE_K = 2


def fit_teacache(x: np.ndarray, y: np.ndarray, degree: int = TEACACHE_DEGREE) -> list[float]:
    """Polynomial (highest power first) mapping input change ``x`` to output change ``y``."""
    x, y = np.asarray(x, np.float64).ravel(), np.asarray(y, np.float64).ravel()
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    distinct = len(np.unique(np.round(x, 12)))
    if distinct < 2:
        raise ValueError(f"TeaCache fit needs at least 2 distinct input changes, got {distinct}; "
                         f"calibrate with more steps")
    deg = min(degree, distinct - 1)
    coeffs = np.polyfit(x, y, deg)
    return [0.0] * (degree - deg) + [float(c) for c in coeffs]


def calibrate(pipe, prompts: list[str], *, name: str, negative_prompt: str | None = None,
              height: int, width: int, num_frames: int, num_inference_steps: int,
              guidance_scale: float, seed: int = 0, teacache_input: str = "modulation",
              progress: bool = False, image=None, **call) -> dict:
    """Generate each prompt (seed ``seed + k``) with every step computed and return the numbers
    entry for ``pipe``'s model (write it with :func:`~.numbers.write_numbers`).
    ``image``: the first frame every prompt is conditioned on (image-to-video models);
    ``call``: further arguments of the pipeline's call (a family's own, e.g. LTX-2's text
    length)."""
    if not prompts:
        raise ValueError("calibration needs at least one prompt")
    if num_inference_steps < 3:
        raise ValueError(f"num_inference_steps={num_inference_steps}: calibration needs >= 3 "
                         f"steps (the published numbers use 50)")
    source = (f"ditax calibrate-cache: {len(prompts)} prompt(s), {num_inference_steps} "
              f"steps, {num_frames}x{height}x{width}, guidance {guidance_scale}"
              + ("" if image is None else ", with an image"))
    runs = []
    for k, prompt in enumerate(prompts):
        pipe(prompt, negative_prompt=negative_prompt, height=height, width=width,
             num_frames=num_frames, num_inference_steps=num_inference_steps,
             guidance_scale=guidance_scale, seed=seed + k, progress=progress, output="latent",
             cache=CALIBRATE, image=image, **call)
        measured = dict(pipe.last_stats["calibration"])
        names = measured.pop("branches")
        runs.append({k: np.asarray(v, np.float64) for k, v in measured.items()})
    x = np.stack([r[f"m_{teacache_input}"][1:] for r in runs])   # [P, N-1, branches]
    y = np.stack([r["m_output"][1:] for r in runs])
    ratios = np.mean(np.stack([r["m_ratio"] for r in runs]), axis=0)   # [N, branches]
    ratios[0] = 1.0
    # the CFG branches' ratios (a family's extra guidance branches take the conditional one's)
    per_branch = [ratios[:, names.index(n)] for n in ("cond", "uncond") if n in names]
    if len(per_branch) == 1:
        per_branch = per_branch * 2
    experts = 1 if getattr(pipe, "transformer_2", None) is None else 2
    return {
        "name": name,
        "source": source,
        "match": match_of(pipe.transformer.config),
        "experts": experts,
        "teacache": {"input": teacache_input, "coefficients": fit_teacache(x, y),
                     "retention_ratio": TEACACHE_RETENTION, "compute_last": False},
        "magcache": {"ratios": [[round(float(v), 6) for v in r] for r in per_branch],
                     "retention_ratio": MAGCACHE_RETENTION, "max_skip_steps": MAGCACHE_K},
        "measured": {"teacache_input_change": np.round(x.mean(0), 6).tolist(),
                     "output_change": np.round(y.mean(0), 6).tolist()},
    }


__all__ = ["calibrate", "fit_teacache"]
