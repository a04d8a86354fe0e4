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
from flax import nnx

from ditax.errors import RequestError
from ditax.pipelines.flux.denoiser import FluxDenoiser, flux_inputs
from ditax.models.flux.packing import PACK, image_ids, text_ids, unpack
from ditax.pipelines.flux.request import check_request
from ditax.pipelines.programs import Programs, in_compile_cache
from ditax.pipelines.sampling import Expert, Prepared, Timings, record


class FluxTextToImage:
    """A loaded FLUX.1 (dev or schnell) text-to-image pipeline; call it with a prompt. See
    :func:`ditax.pipelines.flux.loading.load_pipeline`."""

    batches = True   # requests of one shape stack (ditax.pipelines.batch): see prepare

    def __init__(self, *, tokenizer, text_encoder, tokenizer_2, text_encoder_2, vae,
                 transformer, scheduler, cfg_mode: str = "batched", vae_tiling: bool = False,
                 sample_defaults: dict | None = None):
        self.tokenizer, self.text_encoder = tokenizer, text_encoder          # CLIP
        self.tokenizer_2, self.text_encoder_2 = tokenizer_2, text_encoder_2  # T5
        self.vae = vae
        self.transformer = transformer
        self.scheduler = scheduler
        self.cfg_mode = cfg_mode
        self.vae_tiling = vae_tiling
        self.vae_parallel = None    # a mesh: decode with the rows split over it (load_pipeline)
        self.sample_defaults = dict(sample_defaults or {})   # the folder's ditax_sample.json
        self.load_time = 0.0
        self.timings = Timings()
        self.compile_cache = "auto"   # see ditax.compile_cache; "none" = off
        self.programs = Programs()
        self.last_stats: dict = {}
        self._expert = Expert(*nnx.split(FluxDenoiser(transformer.module)), transformer.config)

    def call_defaults(self, **call) -> dict:
        """``call`` with each value left at None taken from ``self.sample_defaults`` (the
        folder's ``ditax_sample.json``, a LoRA's settings over it), else the family's (FLUX.1:
        1024x1024, 28 steps, 3.5, 512, true CFG off)."""
        from ditax.pipelines.family import pipelines_of   # the family module imports this one
        from ditax.pipelines.sample_defaults import with_defaults

        return with_defaults(call, self.sample_defaults, pipelines_of("flux").sample_defaults)

    @property
    def mesh(self):
        return self.transformer.mesh

    def encode_text(self, prompt: str, prompt_2: str | None, negative_prompt: str | None,
                    use_cfg: bool, max_sequence_length: int):
        """``(T5 embeddings [n, T, Dt], pooled CLIP [n, Dp])`` in the transformer dtype; ``n``
        = 2 (prompt, negative prompt) with true CFG, else 1."""
        from ditax.models.encoders.clip import encode_clip_pooled
        from ditax.models.encoders.t5 import encode_t5_prompt

        clip = [prompt] + ([negative_prompt] if use_cfg else [])
        t5 = [prompt_2 or prompt] + ([negative_prompt] if use_cfg else [])
        dt = jnp.dtype(self.transformer.config.dtype)
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
        from ditax.models.vae.parallel import decode_on      # vae_parallel: rows over the mesh

        image = np.asarray(decode_on(self.vae, z, self.vae_parallel, tiled=self.vae_tiling),
                           np.float32)                                     # [1, 3, H, W]
        image = np.clip(image / np.float32(2) + np.float32(0.5), np.float32(0), np.float32(1))
        return np.ascontiguousarray(np.transpose(image[0], (1, 2, 0)))

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
        from ditax.schedulers.flow_match import check_sigmas

        (height, width, num_inference_steps, guidance_scale, true_cfg_scale,
         max_sequence_length) = self.call_defaults(
            height=height, width=width, num_inference_steps=num_inference_steps,
            guidance_scale=guidance_scale, true_cfg_scale=true_cfg_scale,
            max_sequence_length=max_sequence_length).values()
        tc = self.transformer.config
        check_request(prompt, prompt_2, height, width, num_inference_steps, guidance_scale,
                      negative_prompt, true_cfg_scale, max_sequence_length, seed,
                      factor=self.vae.scale_factor_spatial * PACK)
        if output not in ("image", "latent"):
            raise RequestError(f"output={output!r}; use 'image' or 'latent'")
        if sigmas is None:
            sigmas = default_sigmas(self.sample_defaults, num_inference_steps)
        if sigmas is None:
            sigmas = np.linspace(1.0, 1.0 / num_inference_steps, num_inference_steps)
        try:
            check_sigmas(sigmas, num_inference_steps)
        except ValueError as e:
            raise RequestError(str(e)) from None
        shape = self.packed_shape(height, width)
        h, w = self.latent_size(height, width)

        def condition():
            guidance = (jnp.full((1,), guidance_scale, jnp.float32) if tc.guidance_embeds
                        else None)
            return dict(img_ids=jnp.asarray(image_ids(h, w))[None],
                        txt_ids=jnp.asarray(text_ids(max_sequence_length))[None],
                        guidance=guidance)
        return Prepared(
            programs=self.programs, experts=[self._expert], inputs=flux_inputs,
            scheduler=self.scheduler.with_mu(shape[1]), latent_shape=shape, mesh=self.mesh,
            cfg_mode=self.cfg_mode, num_inference_steps=num_inference_steps,
            guidance_scale=float(true_cfg_scale),
            sigmas=np.asarray(sigmas, np.float64),
            text=lambda use_cfg: self.encode_text(prompt, prompt_2, negative_prompt, use_cfg,
                                                  max_sequence_length),
            condition=condition, latents=latents, seed=seed,
            size=f"for {height}x{width} (diffusers' packed layout)",
            decode=None if output == "latent" else (
                lambda x, _: self.decode(x, height, width)))


__all__ = ["FluxTextToImage"]
