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

from ditax.errors import RequestError
from ditax.models.wan.vace_context import VACE_PIPELINE
from ditax.pipelines.wan.folder import PipelineLoadError
from ditax.pipelines.wan.text_to_video import (VACE_ARGS, RequestPlan, WanTextToVideo,
                                               refuse_extra)
from ditax.models.wan.vace_context import (control_context, mask_frames, reference_frames,
                                           video_frames)
from ditax.pipelines.wan.vace_inputs import (VaceCondition, conditioning_scales, vace_final,
                                             vace_inputs)



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
        return self._condition(*self._control_inputs(video, mask, reference_images,
                                                     conditioning_scale, height, width,
                                                     num_frames))

    def _control_inputs(self, video, mask, reference_images, conditioning_scale, height, width,
                        num_frames) -> tuple:
        """The control inputs checked and converted on the host, once per request: (video
        frames, mask frames, reference frames, per-layer scales)."""
        return (video_frames(video, num_frames, height, width),
                mask_frames(mask, num_frames, height, width, video),
                reference_frames(reference_images, height, width, self.vae.scale_factor_spatial),
                conditioning_scales(conditioning_scale, len(self.transformer.config.vace_layers)))

    def _condition(self, video, mask, references, scales) -> VaceCondition:
        import jax.numpy as jnp

        ctx = control_context(self.vae, video, mask, references)
        return VaceCondition(control=jnp.asarray(ctx, self.dtype),
                             scale=jnp.asarray(scales), references=len(references))

    def plan_request(self, height, width, num_frames, inputs) -> RequestPlan:
        """The control inputs checked (before any encoding) and planned: their context built
        in the condition phase, one latent frame per reference image before the video's."""
        if inputs.pop("image", None) is not None or inputs.pop("last_image", None) is not None:
            raise RequestError("image= / last_image= are for image-to-video folders; a VACE "
                               "folder takes the frames as video= with a mask= (black = keep) "
                               "or as reference_images=")
        # the call's defaults where a request leaves one out (a server's job, a batch's rows
        # come as prepare(**call) with only what was given)
        defaults = {"video": None, "mask": None, "reference_images": None,
                    "conditioning_scale": 1.0}
        control = {k: inputs.pop(k, defaults[k]) for k in ("video", *VACE_ARGS)}
        refuse_extra(self, inputs)
        inputs = self._control_inputs(*(control[k] for k in ("video", *VACE_ARGS)), height,
                                      width, num_frames)
        n_ref = len(inputs[2])
        return RequestPlan(
            condition=lambda: self._condition(*inputs),
            phase="image", extra_frames=n_ref * self.vae.scale_factor_temporal,
            note=f" with {n_ref} reference images")

    def __call__(self, prompt, negative_prompt=None, video=None, mask=None,
                 reference_images=None, conditioning_scale=1.0, **kw):
        """Generate one video (float32 ``[F, H, W, 3]`` in [0, 1]; ``output="latent"``: the
        denoised latents without the reference frames).

        ``video``: control / source frames (``num_frames`` of ``height x width``), ``mask``
        the same frames, white = generate, black = keep; ``reference_images``: one image or a
        list, each a latent frame before the video; ``conditioning_scale``: the hints' scale,
        one number or one per VACE layer. ``latents`` ``[1, z, n + F', Y, X]`` (n = reference
        images) replace the initial noise. Every other argument (keywords) is the
        text-to-video call's (:meth:`WanTextToVideo.__call__`; the same loop and checks,
        :meth:`plan_request` adds the control inputs).
        """
        return super().__call__(prompt, negative_prompt, video=video, mask=mask,
                                reference_images=reference_images,
                                conditioning_scale=conditioning_scale, **kw)


__all__ = ["VACE_PIPELINE", "WanVace", "check_vace_fit"]
