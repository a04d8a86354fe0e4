"""Several text-to-video requests of one shape as one batch through the one compiled step.

Jobs with equal size, frames, steps and guidance (their batch key,
:func:`ditax.serve.requests.check_body`) share the loop of :func:`ditax.pipelines.sampling.
sample`: each job's noise is its own seed's draw (:func:`~ditax.pipelines.sampling.
initial_noise` of the one-video shape), stacked ``[B, C, F', Y, X]``; the text is each job's
(cond, uncond) rows laid out ``[cond_1 .. cond_B, uncond_1 .. uncond_B]`` as the CFG step
splits it (:func:`~ditax.pipelines.denoise.cfg_branches`); each video is decoded alone by the
pipeline's own decode program. A batch of one is exactly what the pipeline's call does (same
noise, text, step program and decode: the same video as ``ditax generate``); a larger batch runs
the same arithmetic on more rows (equal to each job alone within float rounding of the wider
matmuls, checked by the tests).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from ditax.compile_cache import compile_cache
from ditax.errors import RequestError
from ditax.pipelines.sampling import Expert, Timings, initial_noise, sample


def batchable(pipe) -> bool:
    """Whether ``pipe`` runs batches here: it hands out its loop parts (``model_inputs``,
    ``finalize``, ``encode_text``, ``decode_video``) and a request without images has no
    condition (text-to-video; an image-to-video folder needs its image, so its requests run
    one by one through the pipeline's call, as do step-cached ones)."""
    if not all(hasattr(pipe, k) for k in ("model_inputs", "finalize", "encode_text",
                                          "decode_video", "condition", "latent_shape")):
        return False
    try:
        return pipe.condition(None, None, 16, 16, 1) is None
    except RequestError:
        return False


def bucket(n: int, max_batch: int) -> int:
    """The batch a run of ``n`` jobs is padded to: the next power of two, at most
    ``max_batch`` — so a server compiles one step program per power of two instead of one per
    batch size (1, 2, 4 for ``--max-batch 4``)."""
    b = 1
    while b < n:
        b *= 2
    return max(n, min(b, max_batch))


def generate_batch(pipe, calls: Sequence[dict], on_step: Callable[[int], None] | None = None,
                   pad_to: int | None = None) -> list[np.ndarray]:
    """Videos ``[F, H, W, 3]`` (float32 in [0, 1]) of ``calls`` (checked pipeline calls with
    equal height, width, num_frames, num_inference_steps, guidance_scale(_2); no images, no
    step cache); ``on_step(steps_done)`` after each step. ``pad_to``: run that many rows (the
    first call's repeated; rows are independent, and the padding is neither decoded nor
    returned). ``pipe.timings`` holds the batch's."""
    real = len(calls)
    calls = list(calls) + [calls[0]] * max(0, (pad_to or real) - real)
    first = calls[0]
    h, w, f = first["height"], first["width"], first["num_frames"]
    steps, g, g2 = first["num_inference_steps"], first["guidance_scale"], first["guidance_scale_2"]
    for c in calls:                 # each was checked at submit, by generate's checks
        if (c["height"], c["width"], c["num_frames"], c["num_inference_steps"],
                c["guidance_scale"], c["guidance_scale_2"]) != (h, w, f, steps, g, g2):
            raise ValueError("generate_batch: the calls differ in shape, steps or guidance")
    one = pipe.latent_shape(h, w, f)                       # [1, C, F', Y, X]
    shape = (len(calls), *one[1:])
    noise = jnp.concatenate([initial_noise(c["seed"], one) for c in calls])
    experts = [Expert(tr._gdef, tr._state, tr.config)
               for tr in (pipe.transformer, pipe.transformer_2) if tr is not None]
    sharding = None if pipe.mesh is None else NamedSharding(pipe.mesh, P())

    def text(use_cfg):
        rows = [pipe.encode_text(c["prompt"], c["negative_prompt"], use_cfg) for c in calls]
        return jnp.concatenate([r[0:1] for r in rows] + ([r[1:2] for r in rows] if use_cfg
                                                         else []))

    with compile_cache(pipe.compile_cache):
        out = sample(
            programs=pipe.programs, experts=experts, inputs=pipe.model_inputs,
            scheduler=pipe.scheduler,
            latent_shape=shape, mesh=pipe.mesh, cfg_mode=pipe.cfg_mode,
            num_inference_steps=steps, guidance_scale=g, guidance_scale_2=g2,
            boundary=(None if pipe.boundary_ratio is None
                      else pipe.boundary_ratio * pipe.scheduler.num_train_timesteps),
            text=text, finalize=pipe.finalize, latents=noise, seed=first["seed"],
            sigmas=first.get("sigmas"), progress=False, on_step=on_step,
            size=f"for {f} frames at {h}x{w}",
            decode=lambda x, programs: [pipe.decode_video(row[None], programs)
                                        for row in np.asarray(x)[:real]],
            prepare_decode=lambda: None if pipe.vae_tiling else pipe.programs.decode(
                pipe.vae, one, sharding))
    pipe.last_stats = out.stats
    pipe.timings = Timings(load=pipe.load_time, **out.timings)
    return out.output


__all__ = ["batchable", "bucket", "generate_batch"]
