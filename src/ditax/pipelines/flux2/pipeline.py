"""FLUX.2 image pipeline (dev and klein): prompt [+ reference images] → image ``[H, W, 3]`` in
[0, 1].

Built from a diffusers ``Flux2Pipeline`` / ``Flux2KleinPipeline`` folder (:mod:`.loading`), it
reproduces that pipeline's sampling:

1. text: the prompt rendered in the text encoder's chat template, padded to
   ``max_sequence_length``, and three of its hidden states side by side ``[1, T, 3 D]``
   (:mod:`ditax.models.encoders.decoder_lm.flux2_text`: Qwen3 layers 9, 18, 27 for klein,
   Mistral-3 layers 10, 20, 30 for dev; ``text_encoder_out_layers`` chooses others); a klein
   base folder with ``guidance_scale > 1`` adds the negative prompt's (default ``""``) as a
   second row for true CFG;
2. reference images (``image=``, one or several; :mod:`.references`): each VAE-encoded (the
   posterior mean), patchified, normalised by the VAE's latent BatchNorm statistics and
   packed, with position ids at its own time offset (:mod:`.layout`); appended to the noisy
   tokens on every step and cut from the prediction (:mod:`.denoiser`);
3. latents ``[1, (H/16)(W/16), 4C]`` (packed; given ``latents`` as diffusers'
   ``[1, 4C, H/16, W/16]`` or packed) drawn from N(0, 1) (``jax.random``, from ``seed``)
   unless given;
4. denoise on flow-match Euler with ``sigmas = linspace(1, 1/N, N)`` (or the call's) shifted
   with FLUX.2's empirical ``mu`` (:mod:`.schedule`), the transformer fed ``t / 1000`` and,
   for dev, the embedded ``guidance_scale``;
5. decode: unpack, denormalise, unpatchify, VAE decode, ``x / 2 + 0.5`` clipped.

Step 4 is the generic loop (:func:`ditax.pipelines.sampling.sample`): one compiled step program
per request signature, in jax's persistent compilation cache (``pipe.compile_cache``).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ditax.errors import RequestError
from ditax.pipelines.base import Pipeline, check_output, euler_sigmas
from ditax.pipelines.flux2 import layout
from ditax.pipelines.flux2.denoiser import Flux2Denoiser, flux2_inputs
from ditax.pipelines.flux2.references import (check_references, prepare_reference,
                                              reference_list)
from ditax.pipelines.flux2.request import KLEIN_BASE, check_request, guidance_for
from ditax.pipelines.flux2.schedule import request_scheduler
from ditax.pipelines.programs import in_compile_cache
from ditax.pipelines.sampling import Prepared, record

# diffusers' call arguments a ditax call does not take -> the fix
_NOT_TAKEN = {
    "prompt_embeds": "pass prompt= (the text is encoded here)",
    "negative_prompt_embeds": "pass negative_prompt= (klein base with CFG)",
    "num_images_per_prompt": "call once per image with its own seed (or generate --prompts "
                             "for a batch)",
    "output_type": "the call returns a float32 numpy image; output='latent' for the latents",
    "return_dict": "the call returns the image itself",
    "caption_upsample_temperature": "prompt upsampling by the text model is not run; pass "
                                    "the prompt as it should be read",
    "callback_on_step_end": "progress=True shows the steps",
    "callback_on_step_end_tensor_inputs": "progress=True shows the steps",
    "attention_kwargs": "choose the attention at load time (attention=)",
}


def refuse_unsupported(given: dict) -> None:
    """One :class:`RequestError` for keyword arguments the call does not take, naming each
    and, for diffusers' own, the fix (:data:`_NOT_TAKEN`)."""
    if not given:
        return
    name = sorted(given)[0]
    fix = _NOT_TAKEN.get(name)
    if fix is None:
        raise RequestError(f"{name}= is not an argument of the FLUX.2 pipeline call (it takes "
                           f"prompt, image, height, width, num_inference_steps, guidance_scale, "
                           f"seed / generator, latents, negative_prompt, max_sequence_length, "
                           f"text_encoder_out_layers, sigmas, output, progress)")
    raise RequestError(f"{name}= (diffusers') is not taken here: {fix}")


class Flux2ImagePipeline(Pipeline):
    """A loaded FLUX.2 pipeline (dev, klein base or klein distilled); call it with a prompt.
    See :func:`ditax.pipelines.flux2.loading.load_pipeline`. Its runtime state is
    :class:`~ditax.pipelines.base.Pipeline`'s; :meth:`call_defaults` falls back to FLUX.2's
    defaults (1024x1024, 50 steps, 512 tokens; the guidance scale stays None: the folder's
    kind decides, :func:`guidance_for`)."""

    family = "flux2"
    denoiser = Flux2Denoiser

    def __init__(self, *, kind: str, tokenizer, text_encoder, embed_prompts, text_layers,
                 **runtime):
        super().__init__(**runtime)   # vae, transformer, scheduler, cfg_mode, vae_tiling, ...
        self.kind = kind                     # ditax.pipelines.flux2.request.KINDS
        self.tokenizer, self.text_encoder = tokenizer, text_encoder
        self.embed_prompts = embed_prompts   # (model, tokenizer, prompts, max_len, layers)
        # the hidden states read where a call names none (diffusers' per-pipeline default)
        self.text_encoder_out_layers = tuple(text_layers)

    @property
    def grid(self) -> int:
        """Sizes are multiples of this: the VAE's factor x the 2x2 patch (16 for FLUX.2)."""
        return self.vae.scale_factor_spatial * 2

    # --- the parts of a request
    def encode_text(self, prompts: list[str], max_sequence_length: int, layers):
        """``[len(prompts), T, D_joint]`` in the transformer dtype (module docstring, 1)."""
        emb = self.embed_prompts(self.text_encoder, self.tokenizer, prompts,
                                 max_sequence_length, layers)
        return jnp.asarray(emb).astype(self.dtype)

    def encode_references(self, images: list[np.ndarray]):
        """Prepared reference images (each ``[1, 3, H_i, W_i]`` in [-1, 1]) → ``(tokens
        [1, R, 4C], ids [1, R, 4])`` (module docstring, 2)."""
        vae, parts, grids = self.vae, [], []
        for x in images:
            z = vae.encode(jnp.asarray(x, vae.dtype), tiled=self.vae_tiling)   # the mean
            z = vae.normalize_latents(vae.patchify_latents(z))
            grids.append(z.shape[2:])
            parts.append(layout.pack(z))
        dt = self.dtype
        tokens = jnp.concatenate(parts, axis=1).astype(dt)
        return tokens, jnp.asarray(layout.reference_ids(grids))[None]

    def decode(self, tokens, height: int, width: int) -> np.ndarray:
        """Packed latents ``[1, L, 4C]`` → float32 image ``[H, W, 3]`` in [0, 1]."""
        vae = self.vae
        z = layout.unpack(jnp.asarray(tokens, vae.dtype), height // self.grid,
                          width // self.grid)
        return self.decode_pixels(vae.unpatchify_latents(vae.denormalize_latents(z)))

    def packed_shape(self, height: int, width: int) -> tuple[int, int, int]:
        """The packed latents ``[1, (H/16)(W/16), 4C]`` of an image of this size."""
        tokens = (height // self.grid) * (width // self.grid)
        return 1, tokens, self.transformer.config.in_channels

    def initial_latents(self, latents, height: int, width: int):
        """Given ``latents`` as the loop's packed float32 ``[1, L, 4C]``: diffusers' grid form
        ``[1, 4C, H/16, W/16]`` is packed, the packed form taken as it is (a missing batch axis
        of either added); any other shape is one :class:`RequestError`."""
        b, n, c = self.packed_shape(height, width)
        h, w = height // self.grid, width // self.grid
        x = np.asarray(latents, np.float32)
        if x.ndim == 3 and x.shape == (c, h, w) or x.ndim == 4 and x.shape == (1, c, h, w):
            return layout.pack(x.reshape(1, c, h, w))
        if x.shape in ((n, c), (1, n, c)):
            return x.reshape(1, n, c)
        raise RequestError(f"latents shape {x.shape} does not match {height}x{width}: give "
                           f"diffusers' [1, {c}, {h}, {w}] or the packed [1, {n}, {c}]")

    # --- a call
    @in_compile_cache
    def __call__(self, prompt=None, *, image=None, height: int | None = None,
                 width: int | None = None, num_inference_steps: int | None = None,
                 guidance_scale: float | None = None, seed: int = 0, generator=None,
                 latents=None, negative_prompt: str | None = None,
                 max_sequence_length: int | None = None, text_encoder_out_layers=None,
                 sigmas=None, output: str = "image", progress: bool = True, **unsupported):
        """Generate one image: float32 ``[H, W, 3]`` in [0, 1] (``output="latent"``: the
        denoised packed latents ``[1, L, 4C]``). diffusers' argument names:

        - ``image``: one reference image or a list (PIL, or uint8 ``[H, W, 3]``): generation
          conditioned on them (module docstring, 2); the size then defaults to the first
          one's (after its preparation), as diffusers';
        - ``height``, ``width`` (multiples of 16), ``num_inference_steps``,
          ``max_sequence_length`` left at None: the folder's ``ditax_sample.json``, else
          FLUX.2's (1024x1024, 50, 512);
        - ``guidance_scale``: dev's embedded guidance; klein base's true CFG scale (> 1: CFG
          against ``negative_prompt``, default ``""``); a distilled klein takes none. None:
          the folder's file, else 4 (dev, klein base) / off (distilled);
        - ``latents``: diffusers' ``[1, 4C, H/16, W/16]`` (or packed ``[1, L, 4C]``) instead
          of the noise drawn from ``seed`` (``generator``: an int, the same as ``seed``; the
          noise is jax's, so only given latents reproduce diffusers' image);
        - ``text_encoder_out_layers``: the text encoder's hidden states read (default: the
          kind's, ``pipe.text_encoder_out_layers``); ``sigmas``: one per step, unshifted.

        diffusers' arguments this call does not take (``prompt_embeds``,
        ``num_images_per_prompt``, ``output_type``, ``caption_upsample_temperature``...) are
        one :class:`RequestError` naming them (:func:`refuse_unsupported`).
        """
        refuse_unsupported(unsupported)
        return record(self, self.prepare(
            prompt, image=image, height=height, width=width,
            num_inference_steps=num_inference_steps, guidance_scale=guidance_scale, seed=seed,
            generator=generator, latents=latents, negative_prompt=negative_prompt,
            max_sequence_length=max_sequence_length,
            text_encoder_out_layers=text_encoder_out_layers, sigmas=sigmas,
            output=output).run(progress))

    def _check_layers(self, layers) -> tuple[int, ...]:
        """The hidden-state layers: ints, whose widths fill the transformer's text width
        (the refusal suggests layers this text encoder has, and the keys that set them)."""
        from ditax.models.encoders.decoder_lm.flux2_text import check_text_layers

        cfg = self.text_encoder.cfg
        return check_text_layers(layers, cfg.num_layers, cfg.hidden_size,
                                 self.transformer.config.joint_attention_dim)

    def prepare(self, prompt=None, *, image=None, height=None, width=None,
                num_inference_steps=None, guidance_scale=None, seed=0, generator=None,
                latents=None, negative_prompt=None, max_sequence_length=None,
                text_encoder_out_layers=None, sigmas=None, output="image") -> Prepared:
        """One request checked and laid out as the loop's parts
        (:class:`~ditax.pipelines.sampling.Prepared`; nothing encoded or compiled yet): what
        :meth:`__call__` runs, and what a server's batch stacks with other requests of the
        same shape (the condition's arrays carry this request's batch axis). Arguments: the
        call's."""
        if generator is not None:
            if isinstance(generator, bool) or not isinstance(generator, int):
                raise RequestError(f"generator={type(generator).__name__}: ditax draws its noise "
                                   f"with jax.random; pass an int seed (seed=) or latents=")
            seed = generator
        images = reference_list(image)
        sizes = check_references(images, self.grid)          # before any work
        if images:     # diffusers: a size not given is the first reference's
            height = sizes[0][0] if height is None else height
            width = sizes[0][1] if width is None else width
        (height, width, num_inference_steps, guidance_scale,
         max_sequence_length) = self.call_defaults(
            height=height, width=width, num_inference_steps=num_inference_steps,
            guidance_scale=guidance_scale, max_sequence_length=max_sequence_length).values()
        check_request(prompt, height, width, num_inference_steps, guidance_scale,
                      negative_prompt, max_sequence_length, seed, kind=self.kind,
                      grid=self.grid)
        layers = self._check_layers(self.text_encoder_out_layers
                                    if text_encoder_out_layers is None
                                    else text_encoder_out_layers)
        check_output(output, ("image", "latent"))
        sigmas = euler_sigmas(sigmas, num_inference_steps)
        shape = self.packed_shape(height, width)
        if latents is not None:
            latents = self.initial_latents(latents, height, width)
        g = guidance_for(self.kind, guidance_scale)
        cfg_scale = g if self.kind == KLEIN_BASE else 1.0      # true CFG: klein base only
        embedded = self.transformer.config.guidance_embeds
        h, w = height // self.grid, width // self.grid

        def condition():
            ref = ref_ids = None
            if images:
                ref, ref_ids = self.encode_references(
                    [prepare_reference(im, self.grid, f"image[{i}]")
                     for i, im in enumerate(images)])
            return dict(img_ids=jnp.asarray(layout.latent_ids(h, w))[None],
                        txt_ids=jnp.asarray(layout.text_ids(max_sequence_length))[None],
                        guidance=jnp.full((1,), g, jnp.float32) if embedded else None,
                        ref=ref, ref_ids=ref_ids)

        def text(use_cfg):
            prompts = [prompt] + ([negative_prompt or ""] if use_cfg else [])
            return self.encode_text(prompts, max_sequence_length, layers)

        return self.prepared(
            inputs=flux2_inputs,
            scheduler=request_scheduler(self.scheduler, shape[1], num_inference_steps),
            latent_shape=shape, num_inference_steps=num_inference_steps,
            guidance_scale=float(cfg_scale), sigmas=sigmas, text=text, condition=condition,
            condition_phase="image" if images else "condition", latents=latents, seed=seed,
            size=f"for {height}x{width} (packed [1, L, 4C])",
            decode=None if output == "latent" else (
                lambda x, _: self.decode(x, height, width)))


__all__ = ["Flux2ImagePipeline"]
