"""Wan text-to-video pipeline: prompt → video ``[F, H, W, 3]`` in [0, 1].

Built from a diffusers ``WanPipeline`` folder (``model_index.json`` with ``tokenizer/``,
``text_encoder/``, ``vae/``, ``scheduler/``, ``transformer/`` and, for Wan 2.2 A14B,
``transformer_2/`` plus ``boundary_ratio``; see :mod:`.loading`, :mod:`.folder` and
:mod:`.components`), it reproduces the reference sampling loop:

1. text: UMT5 embeddings of the prompt and (with guidance > 1) the negative prompt, padded to
   ``max_sequence_length`` with rows past each prompt's length zeroed;
2. latents ``[1, C, (F-1)/4 + 1, H/8, W/8]`` (4, 8: the VAE's temporal / spatial factors)
   drawn from N(0, 1) (``jax.random``, from ``seed``) unless given;
3. denoise: at step i the timestep ``t_i`` picks the expert (``transformer`` while
   ``t_i >= boundary_ratio * num_train_timesteps``, else ``transformer_2``) and its guidance
   scale; velocity ``v = v_uncond + g (v_cond - v_uncond)``; one scheduler step;
4. decode: ``z * latents_std + latents_mean``, VAE decode, ``video * 0.5 + 0.5`` clipped.

The whole of step 3 is one jitted function (:mod:`.denoise`) of ``(expert params, scheduler
state, latents, text, guidance)`` — the step index lives in the scheduler state as a traced
scalar, and both experts share one graph, so it compiles once and every step (of either expert)
reuses it. It and the VAE decode are compiled ahead of time for the request's shapes before the
first step (:mod:`.programs`; the ``compile`` phase of the timing line), inside jax's persistent
compilation cache (:mod:`ditax.compile_cache`; ``pipe.compile_cache``, default ``"auto"``).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from ditax.errors import RequestError
from ditax.pipelines.wan.conditioning import final_latents
from ditax.pipelines.wan.folder import PipelineLoadError
from ditax.pipelines.base import Pipeline, step_cache_options
from ditax.pipelines.programs import in_compile_cache
from ditax.pipelines.lora_sample import default_sigmas
from ditax.pipelines.wan.request import check_grid, check_max_sequence_length, check_request
from ditax.pipelines.sampling import Expert, Prepared, Timings, record
from ditax.pipelines.wan.inputs import wan_inputs


# ----------------------------------------------------------------------------------------------
# the pipeline

VACE_ARGS = ("mask", "reference_images", "conditioning_scale")


@dataclasses.dataclass(frozen=True)
class RequestPlan:
    """What a request adds to the text-to-video loop (:meth:`WanTextToVideo.plan_request`, the
    hook subclasses such as VACE override): ``condition()`` builds the step's condition in the
    ``phase`` of the timing line; ``extra_frames`` video frames' worth of latents come before
    the output's (VACE's reference images; dropped by the pipeline's ``finalize``); ``note``
    ends the size line."""

    condition: Callable[[], object]
    phase: str = "condition"
    extra_frames: int = 0
    note: str = ""


def refuse_extra(pipe, extra: dict) -> None:
    """A :class:`RequestError` naming the first argument in ``extra`` the pipeline's call does
    not take (VACE's control inputs: load a VACE folder) — instead of Python's TypeError."""
    if not extra:
        return
    name, kind = sorted(extra)[0], type(pipe).__name__
    if name in VACE_ARGS or name == "video":
        alt = (" or, for a source video, a video-to-video pipeline (strength=; "
               "load_pipeline(folder, video_to_video=True))" if name == "video" else "")
        raise RequestError(f"{name}= is a VACE control input; this {kind} pipeline takes none "
                           f"— load a VACE folder (WanVACEPipeline, e.g. "
                           f"Wan2.1-VACE-1.3B-diffusers){alt}, or drop {name}=")
    raise RequestError(f"{name}= is not an argument of {kind}(...); see "
                       f"help({kind}.__call__) for the ones it takes")


class WanTextToVideo(Pipeline):
    """A loaded Wan text-to-video pipeline; call it with a prompt. See
    :func:`~ditax.pipelines.wan.loading.load_pipeline`. Its runtime state is
    :class:`~ditax.pipelines.base.Pipeline`'s; its experts are its transformers
    (``transformer_2``: Wan 2.2's low-noise expert, below ``boundary_ratio``)."""

    family = "wan"
    # the family's parts of the generic loop (also what ditax.serve's batches run with)
    model_inputs = staticmethod(wan_inputs)
    finalize = staticmethod(final_latents)
    hands_frames = True       # frames_to= (Pipeline.hand_frames; a causal student's chunks)

    @property
    def streams_chunks(self) -> bool:
        """Whether this is a causal student (``causal_chunk`` in its transformer's config): a
        call samples chunk by chunk and takes ``on_chunk(index, frames_so_far, frames)``."""
        return self.transformer.config.causal_chunk is not None

    @property
    def batches(self) -> bool:
        """A causal student runs one request a call (not the batched loop)."""
        return not self.streams_chunks

    def __init__(self, *, tokenizer, text_encoder, transformer_2=None, boundary_ratio=None,
                 max_sequence_length=512, **runtime):
        if transformer_2 is not None and boundary_ratio is None:
            raise PipelineLoadError("transformer_2 is present but boundary_ratio is null in "
                                    "model_index.json; set boundary_ratio (Wan 2.2: 0.875)")
        super().__init__(**runtime)   # vae, transformer, scheduler, cfg_mode, vae_tiling, ...
        self.tokenizer = tokenizer
        self.text_encoder = text_encoder
        self.transformer_2 = transformer_2
        self.boundary_ratio = boundary_ratio
        self.max_sequence_length = max_sequence_length

    def experts(self) -> list[Expert]:
        """The transformers as the loop's experts (their current parameters)."""
        return [Expert(tr._gdef, tr._state, tr.config)
                for tr in (self.transformer, self.transformer_2) if tr is not None]

    # --- phases
    def encode_text(self, prompt: str, negative_prompt: str | None, use_cfg: bool,
                    max_sequence_length: int | None = None):
        """``[2, T, Dt]`` (cond, uncond) with guidance, else ``[1, T, Dt]``; transformer dtype.
        ``T`` = ``max_sequence_length``, default the pipeline's."""
        from ditax.models.encoders.umt5 import encode_prompt

        prompts = [prompt, negative_prompt or ""] if use_cfg else [prompt]
        emb = encode_prompt(self.tokenizer, self.text_encoder, prompts,
                            max_sequence_length or self.max_sequence_length)
        return emb.astype(self.dtype)

    def latent_shape(self, height: int, width: int, num_frames: int) -> tuple[int, ...]:
        """Initial latents ``[1, z, F', Y, X]`` for a video of this size (the VAE's factors)."""
        return (1, self.vae.z_dim,
                *self.vae.config.latent_grid(num_frames, height, width))

    def condition(self, image, last_image, height: int, width: int, num_frames: int):
        """The request's :class:`~ditax.pipelines.wan.conditioning.Condition` (None: text only).
        Text-to-video folders take no image; image-to-video pipelines override this."""
        if image is not None or last_image is not None:
            raise RequestError("this pipeline folder is text-to-video (WanPipeline); it takes "
                               "no image — drop image= / --image, or load an image-to-video "
                               "folder (Wan2.1-I2V-*, Wan2.2-I2V-A14B, Wan2.2-TI2V-5B)")
        return None

    def decode_video(self, x, programs=None, frames_to=None, **decoding):
        """Final latents ``[1, C, F', Y, X]`` → float32 video ``[F, H, W, 3]`` in [0, 1]
        (``programs``: the decode's compiled programs, :meth:`Programs.decode`; ``decoding``:
        :meth:`decode_options`', else chosen here; ``frames_to``: the frames handed over as
        they are decoded, :meth:`~ditax.pipelines.base.Pipeline.hand_frames`)."""
        z = self.vae.denormalize_latents(jnp.asarray(x, self.vae.dtype))
        if frames_to is not None:
            return self.hand_frames(z, frames_to, programs=programs, **decoding)
        return self.decode_pixels(z, programs=programs, **decoding)

    def sample_options(self, num_inference_steps: int) -> dict:
        """More arguments of :func:`~ditax.pipelines.sampling.sample` for this request (the
        video-to-video pipeline's start step and source); none for text-to-video."""
        return {}

    def plan_request(self, height: int, width: int, num_frames: int,
                     inputs: dict) -> RequestPlan:
        """The request's :class:`RequestPlan` once sizes are known (checks here run before any
        encoding): the image condition of :meth:`condition` (``inputs``' ``image`` /
        ``last_image``); other keywords the call does not take refused by
        :func:`refuse_extra`."""
        image, last_image = inputs.pop("image", None), inputs.pop("last_image", None)
        refuse_extra(self, inputs)
        return RequestPlan(
            condition=lambda: self.condition(image, last_image, height, width, num_frames),
            phase="condition" if image is None and last_image is None else "image")

    def stream(self, prompt, **kw):
        """A causal student's video as frames per chunk, each yielded once made
        (:func:`ditax.pipelines.wan.causal.stream`: ``chunk=``, sizes, steps, ...)."""
        from ditax.pipelines.wan.causal import stream

        return stream(self, prompt, **kw)

    @in_compile_cache
    def __call__(self, prompt, negative_prompt=None, height: int | None = None,
                 width: int | None = None, num_frames: int | None = None,
                 num_inference_steps: int | None = None,
                 guidance_scale: float | None = None, seed: int = 0, latents=None,
                 guidance_scale_2: float | None = None, progress: bool = True,
                 output: str = "video", sigmas=None, cache: str | None = None,
                 cache_threshold: float | None = None, cfg_cache: bool = False,
                 cache_coefficients=None, image=None, last_image=None,
                 max_sequence_length: int | None = None, **extra):
        """Generate one video: :meth:`prepare` (the same arguments but ``progress``), then the
        loop. Returns float32 ``[F, H, W, 3]`` in [0, 1]
        (``output="latent"``: the denoised latents ``[1, C, F', Y, X]`` instead).

        ``latents`` (optional, ``[1, C, F', H/8, W/8]`` or without the batch axis) replaces the
        initial noise; otherwise it is ``jax.random.normal(PRNGKey(seed))``. Guidance is on
        when ``guidance_scale > 1`` (as the reference); ``guidance_scale_2`` is the low-noise
        expert's scale (Wan 2.2; defaults to ``guidance_scale``). ``sigmas`` (Euler sampler
        only): the noise level of each step before the shift, as diffusers'
        ``set_timesteps(sigmas=)`` — the 4-step distillation LoRAs use 1, 0.75, 0.5, 0.25 with
        shift 5 (``sample.preset=lightning-4step``).

        Step caching (:mod:`.step_cache`): ``cache`` "first_block" | "teacache" | "magcache"
        skips transformer evaluations whose result a cached residual predicts well enough
        (``cache_threshold``: None = the method's default; larger skips more);
        ``cfg_cache=True`` reuses the unconditional branch's difference on low-noise steps;
        ``cache_coefficients``: a numbers file of ``ditax calibrate-cache`` (default: the
        shipped numbers of the model, if any). ``cache=None, cfg_cache=False`` runs the plain
        step. ``self.last_stats`` tells what ran. ``image`` / ``last_image``:
        image-to-video pipelines (:class:`~ditax.pipelines.wan.image_to_video.WanImageToVideo`;
        step caching works there too). ``max_sequence_length``: text
        tokens for this call (diffusers' argument of that name; default the pipeline's, 512).
        ``frames_to``: an :class:`~ditax.io.video_stream.Mp4Stream` (or any object with its
        ``put`` / ``whole``) the decoded frames are handed to chunk by chunk as they are
        decoded (:meth:`~ditax.pipelines.base.Pipeline.hand_frames`; a causal student's:
        each chunk as it is made); the call still returns the whole video.

        Sizes, steps, guidance, the negative prompt and ``sigmas`` left at None come from
        ``self.sample_defaults`` (the folder's ``ditax_sample.json``, a LoRA's sampling
        settings over it: :mod:`ditax.pipelines.lora_sample`; ``sigmas`` only with their step
        count), else Wan's (480x832, 81 frames, 50 steps, guidance 5.0). ``seed``: an int in [0, 2**32) (``jax.random.PRNGKey``).
        Any other keyword goes to :meth:`plan_request` (VACE's control inputs; here a
        :class:`RequestError` naming it). A causal student (``causal_chunk`` in its
        transformer's config) samples chunk by chunk instead
        (:func:`ditax.pipelines.wan.causal.video`; ``context_chunks=``).
        """
        if self.streams_chunks:
            from ditax.pipelines.wan.causal import video

            return video(self, prompt, negative_prompt, height, width, num_frames,
                         num_inference_steps, guidance_scale, seed, latents, output=output,
                         sigmas=sigmas, max_sequence_length=max_sequence_length,
                         guidance_scale_2=guidance_scale_2, cache=cache,
                         cache_threshold=cache_threshold, cfg_cache=cfg_cache,
                         cache_coefficients=cache_coefficients, image=image,
                         last_image=last_image, **extra)
        return record(self, self.prepare(
            prompt, negative_prompt, height, width, num_frames, num_inference_steps,
            guidance_scale, seed, latents, guidance_scale_2, output=output, sigmas=sigmas,
            max_sequence_length=max_sequence_length, cache=cache,
            cache_threshold=cache_threshold, cfg_cache=cfg_cache,
            cache_coefficients=cache_coefficients, image=image, last_image=last_image,
            **extra).run(progress))

    def prepare(self, prompt, negative_prompt=None, height: int | None = None,
                width: int | None = None, num_frames: int | None = None,
                num_inference_steps: int | None = None,
                guidance_scale: float | None = None, seed: int = 0, latents=None,
                guidance_scale_2: float | None = None, *, output: str = "video", sigmas=None,
                max_sequence_length: int | None = None, **inputs) -> Prepared:
        """One request checked and laid out as the loop's parts
        (:class:`~ditax.pipelines.sampling.Prepared`; nothing is encoded or compiled yet):
        what :meth:`__call__` runs, and what a server's batch stacks with other requests of
        the same shape (:func:`ditax.pipelines.batch.sample_batch`). Arguments: the call's;
        ``inputs``: the step-cache arguments (:data:`~ditax.pipelines.base.STEP_CACHE`), the
        call's ``frames_to`` (the decode's, :meth:`decode_video`) and the request's condition
        inputs, which :meth:`plan_request` takes (``image``, ``last_image``; VACE's control
        inputs)."""
        if self.streams_chunks:
            raise RequestError("a causal student (model.causal_chunk) has no whole-video loop "
                               "to prepare; call it (pipe(prompt, ...)) or pipe.stream(...)")
        caching = step_cache_options(inputs)
        frames_to = inputs.pop("frames_to", None)     # the call's (hand_frames)
        # what neither the caller nor the folder's ditax_sample.json gives: Wan's defaults
        (height, width, num_frames, num_inference_steps, guidance_scale, guidance_scale_2,
         negative_prompt) = self.call_defaults(
            height=height, width=width, num_frames=num_frames,
            num_inference_steps=num_inference_steps, guidance_scale=guidance_scale,
            guidance_scale_2=guidance_scale_2, negative_prompt=negative_prompt).values()
        if sigmas is None:
            sigmas = default_sigmas(self.sample_defaults, num_inference_steps)
        check_max_sequence_length(max_sequence_length, RequestError)
        sf = self.vae.scale_factor_spatial * self.transformer.config.patch_size[1]
        check_request(prompt, height, width, num_frames, num_inference_steps, guidance_scale,
                      guidance_scale_2, negative_prompt, spatial=sf,
                      temporal=self.vae.scale_factor_temporal, seed=seed)
        if guidance_scale_2 is not None and self.boundary_ratio is None:
            raise RequestError("guidance_scale_2 applies only to two-expert (Wan 2.2) pipelines "
                               "with boundary_ratio set; this folder has none — drop it")
        plan = self.plan_request(height, width, num_frames, inputs)
        tc, tf = self.transformer.config, self.vae.scale_factor_temporal
        check_grid(height, width, num_frames + plan.extra_frames, tc.rope_max_seq_len, sf, tf,
                   tc.patch_size[0])
        shape = self.latent_shape(height, width, num_frames + plan.extra_frames)
        out_shape = self.latent_shape(height, width, num_frames)
        sharding = None if self.mesh is None else NamedSharding(self.mesh, P())
        # whole or in tiles, before any work (a decode that cannot fit is refused here)
        decoding = {} if output == "latent" else self.decode_options(out_shape)

        return self.prepared(
            inputs=self.model_inputs, scheduler=self.scheduler, latent_shape=shape,
            num_inference_steps=num_inference_steps,
            guidance_scale=guidance_scale, guidance_scale_2=guidance_scale_2,
            boundary=(None if self.boundary_ratio is None
                      else self.boundary_ratio * self.scheduler.num_train_timesteps),
            text=lambda use_cfg: self.encode_text(prompt, negative_prompt, use_cfg,
                                                  max_sequence_length),
            condition=plan.condition, condition_phase=plan.phase,
            finalize=self.finalize, latents=latents, seed=seed, sigmas=sigmas, **caching,
            size=f"for {num_frames} frames at {height}x{width}{plan.note}",
            decode=None if output == "latent" else functools.partial(
                self.decode_video, frames_to=frames_to, **decoding),
            prepare_decode=lambda: None if (decoding.get("tiled") or self.vae_parallel is not None)
            else self.programs.decode(
                self.vae, out_shape, sharding), **self.sample_options(num_inference_steps))


__all__ = ["PipelineLoadError", "RequestPlan", "Timings", "WanTextToVideo", "check_request",
           "refuse_extra"]
