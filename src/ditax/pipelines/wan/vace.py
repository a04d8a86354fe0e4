"""Wan VACE pipeline (diffusers ``WanVACEPipeline``): prompt + control → video ``[F, H, W, 3]``.

One model for reference-to-video, inpainting / outpainting (a mask), control-guided video
(depth / pose / edges as ``video``) and first-last-frame (the given frames kept by the mask).
The loop is the text-to-video one (:mod:`.text_to_video`, :func:`ditax.pipelines.sampling.sample`:
the same compiled step, experts, guidance and step caching); the request adds its control
context, built once on the host and the VAE (:mod:`.vace_inputs`), which every step hands the
transformer as ``control_hidden_states`` with the per-layer ``conditioning_scale``. Reference
images add one latent frame each before the video's (initial latents ``[1, z, n + F', Y, X]``);
they are dropped before decoding.
"""

from __future__ import annotations

from jax.sharding import NamedSharding, PartitionSpec as P

from ditax.errors import RequestError
from ditax.pipelines.programs import in_compile_cache
from ditax.pipelines.sampling import Expert, Timings, sample
from ditax.pipelines.wan.defaults import SAMPLE_DEFAULTS
from ditax.pipelines.wan.folder import PipelineLoadError
from ditax.pipelines.wan.request import check_grid, check_max_sequence_length, check_request
from ditax.pipelines.wan.text_to_video import WanTextToVideo
from ditax.pipelines.wan.vace_inputs import (VaceCondition, conditioning_scales, control_context,
                                             mask_frames, reference_frames, vace_final,
                                             vace_inputs, video_frames)

VACE_PIPELINE = "WanVACEPipeline"


def check_vace_fit(vae, tc) -> None:
    """The control context the pipeline builds (inactive + reactive latents, the mask folded
    ``s x s``) has the transformer's ``vace_in_channels``."""
    want = 2 * vae.z_dim + vae.scale_factor_spatial ** 2
    if getattr(tc, "vace_in_channels", None) != want:
        raise PipelineLoadError(f"the transformer's vace_in_channels="
                                f"{getattr(tc, 'vace_in_channels', None)} does not fit vae "
                                f"z_dim={vae.z_dim}: expected {want} (2 x {vae.z_dim} latents + "
                                f"{vae.scale_factor_spatial ** 2} mask channels); the folder "
                                f"mixes components")


class WanVace(WanTextToVideo):
    """A loaded ``WanVACEPipeline`` folder; call it with a prompt and ``video=`` / ``mask=`` /
    ``reference_images=`` (all optional). See the module docstring."""

    model_inputs = staticmethod(vace_inputs)
    finalize = staticmethod(vace_final)

    def __init__(self, **kw):
        super().__init__(**kw)
        for tr in (self.transformer, self.transformer_2):
            if tr is not None:
                check_vace_fit(self.vae, tr.config)

    def vace_condition(self, video, mask, reference_images, conditioning_scale, height, width,
                       num_frames) -> VaceCondition:
        """The request's control context (:mod:`.vace_inputs`), in the transformer's dtype."""
        import jax.numpy as jnp

        v = video_frames(video, num_frames, height, width)
        m = mask_frames(mask, num_frames, height, width)
        refs = reference_frames(reference_images, height, width,
                                self.vae.scale_factor_spatial)
        ctx = control_context(self.vae, v, m, refs)
        tc = self.transformer.config
        return VaceCondition(control=jnp.asarray(ctx, jnp.dtype(tc.dtype)),
                             scale=jnp.asarray(conditioning_scales(conditioning_scale,
                                                                   len(tc.vace_layers))),
                             references=len(refs))

    @in_compile_cache
    def __call__(self, prompt, negative_prompt=None, video=None, mask=None,
                 reference_images=None, conditioning_scale=1.0, height: int | None = None,
                 width: int | None = None, num_frames: int | None = None,
                 num_inference_steps: int | None = None, guidance_scale: float | None = None,
                 guidance_scale_2: float | None = None, seed: int = 0, latents=None,
                 progress: bool = True, output: str = "video", sigmas=None,
                 cache: str | None = None, cache_threshold: float | None = None,
                 cfg_cache: bool = False, cache_coefficients=None,
                 max_sequence_length: int | None = None, image=None, last_image=None):
        """Generate one video (float32 ``[F, H, W, 3]`` in [0, 1]; ``output="latent"``: the
        denoised latents without the reference frames).

        ``video``: control / source frames (``num_frames`` of ``height x width``), ``mask``
        the same frames, white = generate, black = keep; ``reference_images``: one image or a
        list, each a latent frame before the video; ``conditioning_scale``: the hints' scale,
        one number or one per VACE layer. ``latents`` ``[1, z, n + F', Y, X]`` (n = reference
        images) replace the initial noise. The other arguments are the text-to-video call's.
        """
        if image is not None or last_image is not None:
            raise RequestError("image= / last_image= are for image-to-video folders; a VACE "
                               "folder takes the frames as video= with a mask= (black = keep) "
                               "or as reference_images=")
        d = {**SAMPLE_DEFAULTS, **self.sample_defaults}
        height = d["height"] if height is None else height
        width = d["width"] if width is None else width
        num_frames = d["num_frames"] if num_frames is None else num_frames
        num_inference_steps = (d["num_inference_steps"] if num_inference_steps is None
                               else num_inference_steps)
        guidance_scale = d["guidance_scale"] if guidance_scale is None else guidance_scale
        if guidance_scale_2 is None:
            guidance_scale_2 = d.get("guidance_scale_2")
        if negative_prompt is None:
            negative_prompt = d.get("negative_prompt")
        check_max_sequence_length(max_sequence_length, RequestError)
        tf = self.vae.scale_factor_temporal
        sf = self.vae.scale_factor_spatial * self.transformer.config.patch_size[1]
        check_request(prompt, height, width, num_frames, num_inference_steps, guidance_scale,
                      guidance_scale_2, negative_prompt, spatial=sf, temporal=tf, seed=seed)
        if guidance_scale_2 is not None and self.boundary_ratio is None:
            raise RequestError("guidance_scale_2 applies only to two-expert (Wan 2.2) pipelines "
                               "with boundary_ratio set; this folder has none — drop it")
        # checked here, before any encoding; encoded in the condition phase
        n_ref = len(reference_frames(reference_images, height, width,
                                     self.vae.scale_factor_spatial))
        video_frames(video, num_frames, height, width)
        mask_frames(mask, num_frames, height, width, video)
        tc = self.transformer.config
        conditioning_scales(conditioning_scale, len(tc.vace_layers))
        check_grid(height, width, num_frames + n_ref * tf, tc.rope_max_seq_len, sf, tf,
                   tc.patch_size[0])
        shape = self.latent_shape(height, width, num_frames + n_ref * tf)
        out_shape = self.latent_shape(height, width, num_frames)
        experts = [Expert(tr._gdef, tr._state, tr.config)
                   for tr in (self.transformer, self.transformer_2) if tr is not None]
        sharding = None if self.mesh is None else NamedSharding(self.mesh, P())
        out = sample(
            programs=self.programs, experts=experts, inputs=vace_inputs,
            scheduler=self.scheduler, latent_shape=shape, mesh=self.mesh,
            cfg_mode=self.cfg_mode, num_inference_steps=num_inference_steps,
            guidance_scale=guidance_scale, guidance_scale_2=guidance_scale_2,
            boundary=(None if self.boundary_ratio is None
                      else self.boundary_ratio * self.scheduler.num_train_timesteps),
            text=lambda use_cfg: self.encode_text(prompt, negative_prompt, use_cfg,
                                                  max_sequence_length),
            condition=lambda: self.vace_condition(video, mask, reference_images,
                                                  conditioning_scale, height, width,
                                                  num_frames),
            condition_phase="image", finalize=vace_final, latents=latents, seed=seed,
            sigmas=sigmas, cache=cache, cache_threshold=cache_threshold, cfg_cache=cfg_cache,
            cache_coefficients=cache_coefficients, progress=progress,
            size=f"for {num_frames} frames at {height}x{width} with {n_ref} reference images",
            decode=None if output == "latent" else self.decode_video,
            prepare_decode=lambda: None if self.vae_tiling else self.programs.decode(
                self.vae, out_shape, sharding))
        self.last_stats = out.stats
        self.timings = Timings(load=self.load_time, **out.timings)
        return out.output


__all__ = ["VACE_PIPELINE", "WanVace", "check_vace_fit"]
