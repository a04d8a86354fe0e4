"""LTX-2's two-stage sampling (diffusers' published recipe, ``docs/.../ltx2.md``): a video made
at a lower resolution, its latents upsampled, then refined at the full resolution in a few
steps.

1. stage 1: the LTX-2 pipeline at ``(height, width)`` divided by the upsampler's factor (2x:
   half), ``output="latent"``: raw video latents ``[1, C, F', Y, X]`` and the audio latents;
2. the latent upsampler (:class:`~ditax.pipelines.ltx2.upsample.LTX2LatentUpsample`, with its
   ``adain_factor`` / ``tone_map_compression_ratio``) → ``[1, C, F', 2Y, 2X]``;
3. stage 2: the same pipeline at ``(height, width)`` from those latents and stage 1's audio
   latents, re-noised to the first of the distilled sigmas (:data:`STAGE_2_SIGMAS`,
   ``noise_scale=sigmas[0]``) and stepped down those sigmas as they are (no shift), with
   ``guidance_scale=1`` (the recipe's: the stage-2 model is distilled). Other arguments are
   stage 1's; ``stage_2`` overrides any of them.

The recipe's stage 2 runs with the distilled LoRA (or a distilled checkpoint); here stage 2
runs the pipeline's own transformer (its ``loras=`` included): load a distilled model or LoRA
for it. Stage 2 draws its noise from ``seed + 1`` (stage 1's seed would repeat the start
noise's first values).
"""

from __future__ import annotations

import inspect
import math

from ditax.errors import RequestError
from ditax.intmath import INT_LIMIT

#: diffusers' ``STAGE_2_DISTILLED_SIGMA_VALUES`` (LTX-2's distilled refinement schedule)
STAGE_2_SIGMAS = (0.909375, 0.725, 0.421875)
#: stage 2's own defaults (the recipe's); everything else comes from the stage-1 call
STAGE_2_DEFAULTS = dict(sigmas=STAGE_2_SIGMAS, guidance_scale=1.0, shift_sigmas=False)
#: the upsample step's arguments, taken from ``stage_2``
UPSAMPLE_KEYS = ("adain_factor", "tone_map_compression_ratio")


def _upsampler(pipe, upsampler):
    """The loaded upsample pipeline of ``upsampler``: one already loaded; an
    ``LTX2LatentUpsamplePipeline`` folder (or hub id); or a folder holding the upsampler model
    alone (``latent_upsampler/`` of an LTX-2 folder, as diffusers' docs load it, or the model
    folder itself), run with the LTX-2 pipeline's own VAE. In the pipeline's dtype."""
    from ditax.errors import ConfigError, ModelNotFound
    from ditax.models.ltx2.upsampler.convert import load_latent_upsampler
    from ditax.pipelines.family import resolve
    from ditax.pipelines.ltx2.upsample import (PIPELINE_CLASS, LTX2LatentUpsample, folder_class,
                                               load_upsample_pipeline)

    if isinstance(upsampler, LTX2LatentUpsample):
        return upsampler
    if upsampler is None:
        raise RequestError("stage_2= is the second stage of two-stage sampling: give "
                           "upsampler= (an LTX2LatentUpsamplePipeline folder) too")
    dtype = str(pipe.vae.dtype)
    try:
        root = resolve(upsampler)
    except ModelNotFound:            # no pipeline folder: the model folder itself
        root = None
    if root is not None and folder_class(root) == PIPELINE_CLASS:
        return load_upsample_pipeline(root, dtype, vae_tiling=pipe.vae_tiling)
    model = load_latent_upsampler(upsampler if root is None else root, dtype)
    if model.config.in_channels != pipe.vae.latent_channels:
        raise ConfigError(f"{upsampler}: the latent upsampler takes {model.config.in_channels} "
                          f"latent channels, this pipeline's VAE makes "
                          f"{pipe.vae.latent_channels}; use the upsampler of the same model")
    return LTX2LatentUpsample(upsampler=model, vae=pipe.vae, vae_tiling=pipe.vae_tiling)


def stage_1_size(pipe, up, height: int, width: int) -> tuple[int, int]:
    """Stage 1's ``(height, width)``: the full size over the upsampler's spatial factor, on
    the VAE's grid; one :class:`RequestError` naming a size that does not divide."""
    st, num, den = up.config.factors
    if st != 1:
        raise RequestError("this latent upsampler upsamples in time; two-stage sampling takes a "
                           "spatial one (LTX-2's latent_upsampler/)")
    s = pipe.vae.spatial_compression_ratio
    out = []
    for name, v in (("height", height), ("width", width)):
        small = v * den // num
        if small * num != v * den or small % s or small < s:
            step = s * num // math.gcd(s * num, den)
            raise RequestError(f"{name}={v}: two-stage sampling makes stage 1 at {name} x "
                               f"{den}/{num}, which must be a multiple of {s} (the VAE's); use a "
                               f"multiple of {step}, e.g. {max(step, round(v / step) * step)}")
        out.append(small)
    return out[0], out[1]


def two_stage(pipe, upsampler, prompt, image=None, negative_prompt=None, height=None,
              width=None, num_frames=None, num_inference_steps=None, guidance_scale=None,
              seed: int = 0, latents=None, audio_latents=None, *, progress: bool = True,
              stage_2: dict | None = None, **call):
    """What ``pipe(prompt, ..., upsampler=, stage_2=)`` returns, made in two stages (module
    docstring). ``latents`` / ``audio_latents``: stage 1's start at its size; ``call``: the
    pipeline's other arguments for both stages (``output``, ``audio`` apply to stage 2)."""
    if image is not None or pipe.needs_image:
        raise RequestError("two-stage sampling (upsampler=) is text-to-video here; an image's "
                           "first frame is not carried into stage 2 — drop image= / --upsampler")
    stage_2 = dict(stage_2 or {})
    bad = sorted(k for k in stage_2 if k in ("prompt", "image", "latents", "audio_latents",
                                             "upsampler", "stage_2", "height", "width",
                                             "num_frames", "frame_rate"))
    if bad:
        raise RequestError(f"stage_2 {bad}: stage 2 takes these from stage 1 (and the "
                           f"upsampled latents); set them on the call itself")
    known = (set(inspect.signature(pipe.prepare).parameters) - {"options"}) | set(
        pipe.options) | set(UPSAMPLE_KEYS)
    unknown = sorted(k for k in stage_2 if k not in known)
    if unknown:
        raise RequestError(f"stage_2 {unknown}: no argument of the LTX-2 pipeline's call or "
                           f"of the upsampler ({', '.join(UPSAMPLE_KEYS)})")
    up = _upsampler(pipe, upsampler)
    d = pipe.call_defaults(height=height, width=width, num_frames=num_frames,
                           frame_rate=call.get("frame_rate"))
    height, width = int(d["height"]), int(d["width"])
    h1, w1 = stage_1_size(pipe, up, height, width)
    first = pipe(prompt, None, negative_prompt, h1, w1, d["num_frames"], num_inference_steps,
                 guidance_scale, seed, latents, audio_latents, progress=progress,
                 **{**call, "output": "latent", "audio": True})
    upsampled = up(first["video"], **{k: stage_2.pop(k) for k in UPSAMPLE_KEYS
                                      if k in stage_2})
    # stage 1's noise_scale (re-noising its own given latents) is no stage-2 setting
    shared = {k: v for k, v in call.items() if k != "noise_scale"}
    second = {**shared, **STAGE_2_DEFAULTS, "seed": (int(seed) + 1) % INT_LIMIT, **stage_2}
    sigmas = second["sigmas"]
    second.setdefault("num_inference_steps", len(sigmas))
    second.setdefault("noise_scale", float(sigmas[0]))
    return pipe(prompt, None, negative_prompt, height, width, d["num_frames"],
                latents=upsampled, audio_latents=first["audio"], progress=progress, **second)


__all__ = ["STAGE_2_DEFAULTS", "STAGE_2_SIGMAS", "UPSAMPLE_KEYS", "stage_1_size", "two_stage"]
