"""FLUX.1 text-to-image pipeline: prompt → image ``[H, W, 3]`` in [0, 1].

Built from a diffusers ``FluxPipeline`` folder (:mod:`.loading`), it reproduces that
pipeline's sampling:

1. text: CLIP's pooled vector of ``prompt`` and T5's embeddings of ``prompt_2`` (default
   ``prompt``), padded to ``max_sequence_length`` and attended unmasked; with true CFG
   (``true_cfg_scale > 1``) the same of ``negative_prompt`` as a second row;
2. latents in the packed layout ``[1, (h/2)(w/2), 4C]`` (:mod:`ditax.models.flux.packing`;
   ``h, w`` = the size / the VAE's factor, 8 for FLUX.1) drawn from N(0, 1) (``jax.random``,
   from ``seed``) unless given; position ids of the token grid, zero ids for the text;
3. denoise on flow-match Euler with ``sigmas = linspace(1, 1/N, N)`` (or the call's
   ``sigmas``) shifted by the scheduler (FLUX.1-dev: the dynamic shift ``mu`` of the image
   token count; schnell: none; a loader's ``flow_shift``: that fixed shift),
   the transformer fed ``t / 1000`` and, for a model with a guidance embedding (dev),
   ``guidance_scale``; true CFG ``v = v_neg + s (v - v_neg)``;
4. decode: unpack, ``z / scaling_factor + shift_factor``, VAE decode, ``x / 2 + 0.5`` clipped.

Step 3 is the generic loop (:func:`ditax.pipelines.sampling.sample`): one compiled step program
per request signature, compiled ahead of the first step inside jax's persistent compilation
cache (:mod:`ditax.compile_cache`; ``pipe.compile_cache``, default ``"auto"``).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ditax.pipelines.base import Pipeline, check_output, euler_sigmas
from ditax.pipelines.flux.denoiser import FluxDenoiser, flux_inputs
from ditax.models.flux.packing import PACK, image_ids, text_ids, unpack
from ditax.pipelines.flux.request import check_request
from ditax.pipelines.programs import in_compile_cache
from ditax.pipelines.sampling import Prepared, record


class FluxTextToImage(Pipeline):
    """A loaded FLUX.1 (dev or schnell) text-to-image pipeline; call it with a prompt. See
    :func:`ditax.pipelines.flux.loading.load_pipeline`. Its runtime state (``programs``,
    ``cfg_mode``, ``sample_defaults``, ...) is :class:`~ditax.pipelines.base.Pipeline`'s;
    :meth:`call_defaults` falls back to FLUX.1's defaults (1024x1024, 28 steps, 3.5, 512, true
    CFG off)."""

    family = "flux"
    denoiser = FluxDenoiser

    def __init__(self, *, tokenizer, text_encoder, tokenizer_2, text_encoder_2, **runtime):
        super().__init__(**runtime)   # vae, transformer, scheduler, cfg_mode, vae_tiling, ...
        self.tokenizer, self.text_encoder = tokenizer, text_encoder          # CLIP
        self.tokenizer_2, self.text_encoder_2 = tokenizer_2, text_encoder_2  # T5

    def encode_text(self, prompt: str, prompt_2: str | None, negative_prompt: str | None,
                    use_cfg: bool, max_sequence_length: int):
        """``(T5 embeddings [n, T, Dt], pooled CLIP [n, Dp])`` in the transformer dtype; ``n``
        = 2 (prompt, negative prompt) with true CFG, else 1."""
        from ditax.models.encoders.clip import encode_clip_pooled
        from ditax.models.encoders.t5 import encode_t5_prompt

        clip = [prompt] + ([negative_prompt] if use_cfg else [])
        t5 = [prompt_2 or prompt] + ([negative_prompt] if use_cfg else [])
        dt = self.dtype
        pooled = encode_clip_pooled(self.tokenizer, self.text_encoder, clip)
        emb = encode_t5_prompt(self.tokenizer_2, self.text_encoder_2, t5, max_sequence_length)
        return jnp.asarray(emb).astype(dt), jnp.asarray(pooled).astype(dt)

    def latent_size(self, height: int, width: int) -> tuple[int, int]:
        """Latent ``(h, w)`` of an image (the VAE's factor)."""
        s = self.vae.scale_factor_spatial
        return height // s, width // s

    def packed_shape(self, height: int, width: int) -> tuple[int, int, int]:
        """The packed latents ``[1, (h/2)(w/2), 4C]`` of an image of this size."""
        h, w = self.latent_size(height, width)
        return 1, (h // PACK) * (w // PACK), self.vae.latent_channels * PACK * PACK

    def decode(self, tokens, height: int, width: int) -> np.ndarray:
        """Packed latents → float32 image ``[H, W, 3]`` in [0, 1]."""
        h, w = self.latent_size(height, width)
        z = self.vae.denormalize_latents(unpack(jnp.asarray(tokens, self.vae.dtype), h, w))
        return self.decode_pixels(z)

    @in_compile_cache
    def __call__(self, prompt, prompt_2=None, height: int | None = None,
                 width: int | None = None, num_inference_steps: int | None = None,
                 guidance_scale: float | None = None, seed: int = 0,
                 latents=None, negative_prompt=None, true_cfg_scale: float | None = None,
                 max_sequence_length: int | None = None, progress: bool = True,
                 output: str = "image", sigmas=None):
        """Generate one image: float32 ``[H, W, 3]`` in [0, 1] (``output="latent"``: the
        denoised packed latents ``[1, L, 4C]``).

        ``latents`` (optional, diffusers' packed ``[1, (h/2)(w/2), 4C]``, ``h, w`` = size /
        the VAE's factor) replace the initial noise, so the same latents give diffusers'
        image; otherwise they are ``jax.random.normal(PRNGKey(seed))``. ``guidance_scale`` is
        the embedded guidance of a dev model (a schnell model takes none and ignores it, as
        diffusers);
        ``true_cfg_scale > 1`` runs true CFG against ``negative_prompt`` (required then).
        ``sigmas``: the noise level of each step before the shift, one per step (diffusers'
        ``FluxPipeline(sigmas=)``; default ``linspace(1, 1/N, N)``).
        ``height``, ``width``, ``num_inference_steps``, ``guidance_scale``,
        ``true_cfg_scale``, ``max_sequence_length`` and ``sigmas`` left at None come from
        ``self.sample_defaults`` (the folder's ``ditax_sample.json``, a LoRA's sampling
        settings over it: :mod:`ditax.pipelines.lora_sample`), else FLUX.1's (1024x1024, 28
        steps, guidance 3.5, true CFG 1 = off, 512; ``sigmas`` only with their step count).
        The request is checked and laid out by :meth:`prepare` (same arguments but
        ``progress``), then runs through the generic loop.
        """
        return record(self, self.prepare(
            prompt, prompt_2, height, width, num_inference_steps, guidance_scale, seed, latents,
            negative_prompt, true_cfg_scale, max_sequence_length, output, sigmas).run(progress))

    def prepare(self, prompt, prompt_2=None, height: int | None = None,
                width: int | None = None, num_inference_steps: int | None = None,
                guidance_scale: float | None = None, seed: int = 0, latents=None,
                negative_prompt=None, true_cfg_scale: float | None = None,
                max_sequence_length: int | None = None, output: str = "image",
                sigmas=None) -> Prepared:
        """One request checked and laid out as the loop's parts
        (:class:`~ditax.pipelines.sampling.Prepared`; nothing encoded or compiled yet): what
        :meth:`__call__` runs, and what a server's batch stacks with other requests of the same
        shape (:func:`ditax.pipelines.batch.sample_batch`; the condition's ids and embedded
        guidance carry this request's batch axis). Arguments: the call's."""
        from ditax.pipelines.lora_sample import default_sigmas

        (height, width, num_inference_steps, guidance_scale, true_cfg_scale,
         max_sequence_length) = self.call_defaults(
            height=height, width=width, num_inference_steps=num_inference_steps,
            guidance_scale=guidance_scale, true_cfg_scale=true_cfg_scale,
            max_sequence_length=max_sequence_length).values()
        tc = self.transformer.config
        check_request(prompt, prompt_2, height, width, num_inference_steps, guidance_scale,
                      negative_prompt, true_cfg_scale, max_sequence_length, seed,
                      factor=self.vae.scale_factor_spatial * PACK)
        check_output(output, ("image", "latent"))
        sigmas = euler_sigmas(sigmas, num_inference_steps,
                              default_sigmas(self.sample_defaults, num_inference_steps))
        shape = self.packed_shape(height, width)
        h, w = self.latent_size(height, width)

        def condition():
            guidance = (jnp.full((1,), guidance_scale, jnp.float32) if tc.guidance_embeds
                        else None)
            return dict(img_ids=jnp.asarray(image_ids(h, w))[None],
                        txt_ids=jnp.asarray(text_ids(max_sequence_length))[None],
                        guidance=guidance)
        return self.prepared(
            inputs=flux_inputs, scheduler=self.scheduler.with_mu(shape[1]), latent_shape=shape,
            num_inference_steps=num_inference_steps, guidance_scale=float(true_cfg_scale),
            sigmas=sigmas,
            text=lambda use_cfg: self.encode_text(prompt, prompt_2, negative_prompt, use_cfg,
                                                  max_sequence_length),
            condition=condition, latents=latents, seed=seed,
            size=f"for {height}x{width} (diffusers' packed layout)",
            decode=None if output == "latent" else (
                lambda x, _: self.decode(x, height, width)))


__all__ = ["FluxTextToImage"]
