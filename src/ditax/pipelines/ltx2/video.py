"""LTX-2 text- and image-to-video with sound: prompt (and an image) → ``{"video": [F, H, W, 3]
in [0, 1], "audio": AudioTrack}``.

Built from a diffusers ``LTX2Pipeline`` or ``LTX2ImageToVideoPipeline`` folder (:mod:`.loading`;
the two hold the same components), it reproduces those pipelines:

1. text: Gemma-3's hidden states of the prompt (and of the negative prompt, "" by default,
   with guidance), through the text connectors: video and audio text (:mod:`ditax.models.ltx2
   .text`);
2. latents: video tokens ``[1, L, C]`` (``L = F' Y X``, the VAE's 8x / 32x) and audio tokens
   ``[1, La, Ca]`` (``La`` from the video's length in seconds at the audio VAE's rate), drawn
   from N(0, 1) (``jax.random``, from ``seed``) unless given (``latents`` / ``audio_latents``:
   unpacked ones are normalised and packed as diffusers does); both in one array for the
   generic loop (:mod:`.denoiser`). With an ``image``: re-compressed, resized and encoded
   (:mod:`.image`), its normalised latent is the first latent frame, kept clean (timestep 0
   on its tokens, never stepped);
3. denoise on flow-match Euler with ``sigmas = linspace(1, 1/N, N)`` shifted by the video
   token count's ``mu`` and stretched to the scheduler's terminal sigma; LTX-2's guidance
   (:mod:`.guidance`): per-stream CFG, spatio-temporal guidance (only for a model with
   perturbed attention: for one without, diffusers' extra forward equals the conditional one
   and the term is zero, so it is skipped), modality isolation, rescaling;
4. decode: the video latents unpacked, denormalised (noised to ``decode_timestep`` for a
   timestep-conditioned VAE) and decoded, ``x / 2 + 0.5`` clipped; the audio tokens
   denormalised, unpacked, decoded to a mel spectrogram and voiced by the vocoder.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np

from ditax.errors import RequestError
from ditax.pipelines.base import STEP_CACHE, Pipeline, check_output, euler_sigmas
from ditax.pipelines.ltx2.denoiser import SCALES, LTX2Denoiser, ltx2_inputs
from ditax.pipelines.programs import in_compile_cache
from ditax.pipelines.sampling import Prepared, check_finite, record

#: diffusers' default spatio-temporal guidance blocks (LTX-2.3's 48-layer model)
STG_BLOCKS = (28,)

#: the call's arguments past the first eleven (:meth:`LTX2Video.prepare`), with their defaults
#: (None: the folder's ``ditax_sample.json``, else LTX-2's); ``stg_blocks`` is diffusers'
#: ``spatio_temporal_guidance_blocks``
OPTIONS = dict(frame_rate=None, audio_guidance_scale=None, guidance_rescale=None,
               audio_guidance_rescale=None, stg_scale=None, audio_stg_scale=None,
               modality_scale=None, audio_modality_scale=None, decode_timestep=None,
               decode_noise_scale=None, max_sequence_length=None, sigmas=None, stg_blocks=None,
               image_crf=None, noise_scale=None, shift_sigmas=True, upsampler=None, audio=True,
               output="video", **STEP_CACHE)
#: the keys of the defaults :meth:`LTX2Video.prepare` reads (:meth:`~ditax.pipelines.base
#: .Pipeline.call_defaults`)
DEFAULTED = ("frame_rate", "audio_guidance_scale", "guidance_rescale", "audio_guidance_rescale",
             "stg_scale", "audio_stg_scale", "modality_scale", "audio_modality_scale",
             "decode_timestep", "max_sequence_length")


def call_options(options: dict) -> SimpleNamespace:
    """The call's further arguments (:data:`OPTIONS`) with their defaults; an unknown one is a
    :class:`RequestError` naming it."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise RequestError(f"{unknown[0]}= is not an argument of the LTX-2 pipeline's call; "
                           f"see help(LTX2Video.prepare) for the ones it takes")
    return SimpleNamespace(**{**OPTIONS, **options})


def guidance_scales(d: dict) -> dict[str, float]:
    """The per-stream guidance scales of a call's filled-in arguments ``d`` (:data:`SCALES`;
    a zero audio scale takes the video's, as diffusers' ``audio_x or x``)."""
    scales = {"guidance": float(d["guidance_scale"]), "stg": float(d["stg_scale"]),
              "modality": float(d["modality_scale"]), "rescale": float(d["guidance_rescale"])}
    for k, v in (("audio_guidance", d["audio_guidance_scale"]),
                 ("audio_stg", d["audio_stg_scale"]),
                 ("audio_modality", d["audio_modality_scale"]),
                 ("audio_rescale", d["audio_guidance_rescale"])):
        scales[k] = float(v or scales[k.removeprefix("audio_")])
    return scales


class LTX2Video(Pipeline):
    """A loaded LTX-2 pipeline; call it with a prompt. See
    :func:`ditax.pipelines.ltx2.loading.load_pipeline`. Its runtime state is
    :class:`~ditax.pipelines.base.Pipeline`'s; :meth:`call_defaults` falls back to LTX-2's
    (:data:`~ditax.pipelines.ltx2.family.SAMPLE_DEFAULTS`)."""

    family = "ltx2"
    denoiser = LTX2Denoiser
    options = OPTIONS    # the call's further arguments (prepare's ``options``)

    def __init__(self, *, text, audio_vae, vocoder, needs_image: bool = False, **runtime):
        super().__init__(**runtime)   # vae, transformer, scheduler, cfg_mode, vae_tiling, ...
        self.text = text                         # LTX2Text: tokenizer, Gemma-3, connectors
        self.audio_vae, self.vocoder = audio_vae, vocoder
        self.needs_image = needs_image           # an LTX2ImageToVideoPipeline folder

    # -- shapes ---------------------------------------------------------------------------------

    def grid(self, num_frames: int, height: int, width: int) -> tuple[int, int, int]:
        """Latent ``(F', Y, X)`` of a video (the VAE's factors)."""
        return (num_frames - 1) // self.vae.temporal_compression_ratio + 1, \
            height // self.vae.spatial_compression_ratio, \
            width // self.vae.spatial_compression_ratio

    def audio_frames(self, num_frames: int, frame_rate: float) -> int:
        """Audio latent frames of a video of ``num_frames`` at ``frame_rate``."""
        from ditax.models.ltx2.audio.latents import audio_latent_frames

        a = self.audio_vae
        return audio_latent_frames(num_frames, frame_rate, a.sample_rate, a.hop_length,
                                   a.config.temporal_factor)

    # -- the call -------------------------------------------------------------------------------

    @in_compile_cache
    def __call__(self, prompt, image=None, negative_prompt=None, height=None, width=None,
                 num_frames=None, num_inference_steps=None, guidance_scale=None, seed: int = 0,
                 latents=None, audio_latents=None, progress: bool = True, upsampler=None,
                 stage_2: dict | None = None, **call):
        """Generate one video with its sound track: ``{"video": float32 [F, H, W, 3] in
        [0, 1], "audio": AudioTrack}`` (``audio=False``: the video only; ``output="latent"``:
        ``{"video": [1, C, F', Y, X], "audio": [1, Ca, La, M]}``, denormalised as diffusers'
        ``output_type="latent"``). Arguments: :meth:`prepare`'s. ``upsampler``: an
        ``LTX2LatentUpsamplePipeline`` folder (or its loaded pipeline) for LTX-2's two-stage
        sampling, ``stage_2`` its second stage's arguments (:mod:`.two_stage`)."""
        if upsampler is not None or stage_2 is not None:
            from ditax.pipelines.ltx2.two_stage import two_stage

            return two_stage(self, upsampler, prompt, image, negative_prompt, height, width,
                             num_frames, num_inference_steps, guidance_scale, seed, latents,
                             audio_latents, progress=progress, stage_2=stage_2, **call)
        return record(self, self.prepare(
            prompt, image, negative_prompt, height, width, num_frames, num_inference_steps,
            guidance_scale, seed, latents, audio_latents, **call).run(progress))

    def prepare(self, prompt, image=None, negative_prompt=None, height=None, width=None,
                num_frames=None, num_inference_steps=None, guidance_scale=None, seed: int = 0,
                latents=None, audio_latents=None, **options) -> Prepared:
        """One request checked and laid out as the generic loop's parts (nothing encoded or
        compiled yet). diffusers' argument names and defaults (``LTX2Pipeline``); ``options``:
        the further ones of :data:`OPTIONS`. None takes the folder's ``ditax_sample.json``, else
        LTX-2's. ``stg_blocks``: diffusers' ``spatio_temporal_guidance_blocks``. A zero audio
        scale takes the video's, as diffusers' ``audio_x or x``. Step caching (``cache``,
        ``cache_threshold``, ``cfg_cache``, ``cache_coefficients``) as for Wan
        (:mod:`ditax.pipelines.cache.step_cache`): the spatio-temporal-guidance and
        modality-isolation passes are branches with cache entries of their own."""
        from ditax.pipelines.ltx2.request import check_request

        o = call_options(options)
        d = self.call_defaults(
            height=height, width=width, num_frames=num_frames,
            num_inference_steps=num_inference_steps, guidance_scale=guidance_scale,
            **{k: getattr(o, k) for k in DEFAULTED})
        if not isinstance(prompt, str) or not prompt.strip():
            raise RequestError(f"prompt must be a non-empty string; got {prompt!r}")
        check_output(o.output, ("video", "latent"))
        height, width, frames, steps = (d["height"], d["width"], d["num_frames"],
                                        d["num_inference_steps"])
        check_request(height=height, width=width, num_frames=frames,
                      spatial=self.vae.spatial_compression_ratio,
                      temporal=self.vae.temporal_compression_ratio)
        scales = guidance_scales(d)
        stg_blocks = self._stg_blocks(o.stg_blocks)
        use_cfg = scales["guidance"] > 1.0 or scales["audio_guidance"] > 1.0
        run_stg = bool((scales["stg"] > 0.0 or scales["audio_stg"] > 0.0) and stg_blocks
                       and self.transformer.config.perturbed_attn)
        run_modality = scales["modality"] > 1.0 or scales["audio_modality"] > 1.0
        sigmas = euler_sigmas(o.sigmas, steps)
        if o.upsampler is not None:
            raise RequestError("upsampler= (two-stage sampling) runs as two calls of the "
                               "pipeline, one request at a time: call it (no --batch)")
        scheduler = self._scheduler(o, sigmas, steps, latents)
        grid = self.grid(frames, height, width)
        la = self.audio_frames(frames, float(d["frame_rate"]))
        lv, tc = int(np.prod(grid)), self.transformer.config
        n = lv * tc.in_channels + la * tc.audio_in_channels
        image_to_video = image is not None or (self.needs_image and latents is not None)
        given = self._start(image, latents, audio_latents, o, seed, (height, width), grid, la)
        positions = self.transformer.module.positions(
            *grid, fps=float(d["frame_rate"]), audio_num_frames=la)
        text_len = int(d["max_sequence_length"])

        def text(cfg_rows):
            from ditax.models.ltx2.text.encoder import encode_ltx2_prompt

            rows = [prompt] + ([negative_prompt or ""] if cfg_rows else [])
            video, audio_text, mask = encode_ltx2_prompt(self.text, rows, text_len)
            dt = self.dtype
            return video.astype(dt), audio_text.astype(dt), mask

        first = grid[1] * grid[2]           # the tokens of the first latent frame

        def condition():
            out = dict(positions=jax.tree.map(jnp.asarray, positions),
                       scales={k: jnp.full((1,), scales[k], jnp.float32) for k in SCALES})
            if image_to_video:
                out["cond_mask"] = (jnp.arange(lv) < first).astype(jnp.float32)[None]
            return out

        def decode(x, _):
            return self.decode(x, grid, la, seed, d, o)

        return self.prepared(
            inputs=ltx2_inputs(tuple(stg_blocks) if run_stg else None, run_modality),
            scheduler=scheduler.with_mu(lv), latent_shape=(1, n), num_inference_steps=steps,
            # the loop's CFG switch: on when either stream is guided (diffusers'); the scales
            # themselves travel in the condition
            guidance_scale=2.0 if use_cfg else 1.0, sigmas=sigmas, text=text,
            condition=condition, latents=given, seed=seed,
            **{k: getattr(o, k) for k in STEP_CACHE},
            size=f"for {frames} frames at {height}x{width}", decode=decode)

    def _stg_blocks(self, stg_blocks) -> tuple:
        """The spatio-temporal guidance blocks (default: :data:`STG_BLOCKS` this model has),
        each a block index of the model."""
        layers = self.transformer.config.num_layers
        if stg_blocks is None:
            stg_blocks = tuple(i for i in STG_BLOCKS if i < layers)
        bad = [i for i in stg_blocks if isinstance(i, bool) or not isinstance(i, int)
               or not 0 <= i < layers]
        if bad:
            raise RequestError(f"stg_blocks={list(stg_blocks)}: {bad} are no block indices of "
                               f"this model (0..{layers - 1})")
        return stg_blocks

    def _scheduler(self, o, sigmas, steps: int, latents):
        """The request's scheduler. Stage 2 of two-stage sampling (:mod:`.two_stage`):
        ``noise_scale`` mixes noise from the seed into the given (normalised) latents of both
        streams, ``s noise + (1 - s) latents`` (diffusers' ``noise_scale``, checked here);
        ``shift_sigmas=False`` takes the sigmas as they are (diffusers' recipe rebuilds the
        scheduler with ``use_dynamic_shifting=False, shift_terminal=None``)."""
        if o.noise_scale is not None and not 0.0 <= float(o.noise_scale) <= 1.0:
            raise RequestError(f"noise_scale={o.noise_scale} is outside [0, 1] (the share of "
                               f"fresh noise mixed into the given latents)")
        if o.noise_scale and latents is None:
            raise RequestError(f"noise_scale={o.noise_scale} re-noises given latents (stage 2 "
                               f"of two-stage sampling); give latents= and audio_latents=, or "
                               f"drop noise_scale")
        scheduler = self.scheduler if o.shift_sigmas else dataclasses.replace(
            self.scheduler, use_dynamic_shifting=False, shift_terminal=None)
        if scheduler.shift_terminal and float(np.min(sigmas)) >= 1.0:
            raise RequestError(f"num_inference_steps={steps}: LTX-2's schedule is stretched to "
                               f"end at sigma {scheduler.shift_terminal}, which a single "
                               f"step at sigma 1 cannot; use 2 steps or more")
        return scheduler

    def _start(self, image, latents, audio_latents, o, seed: int, size, grid, la: int):
        """The joint start ``[1, N]`` (None: drawn from the seed by the loop): the given
        latents (re-noised by ``noise_scale``), with an image's latent (resized to ``size``,
        ``(height, width)``) as the first frame."""
        if self.needs_image and image is None and latents is None:
            raise RequestError("this is an image-to-video folder (LTX2ImageToVideoPipeline): "
                               "pass image= (--image FILE), the video's first frame")
        pixels = None
        if image is not None and latents is None:
            from ditax.pipelines.ltx2.image import DEFAULT_CRF, conditioning_image

            pixels = conditioning_image(image, *size,
                                        DEFAULT_CRF if o.image_crf is None else o.image_crf)
        tc = self.transformer.config
        n = int(np.prod(grid)) * tc.in_channels + la * tc.audio_in_channels
        given = self._given_latents(latents, audio_latents, grid, la,
                                    self.audio_vae.config.latent_mel_bins)
        if o.noise_scale:
            given = self._renoised(given, float(o.noise_scale), seed, n)
        if pixels is not None:      # the image's latent as the first frame over the noise
            given = self._image_start(pixels, seed, n, grid, given)
        return given

    def _given_latents(self, latents, audio_latents, grid, la: int, mel: int):
        """Given latents as the joint array ``[1, N]`` (None: drawn from the seed). Video:
        packed ``[1, L, C]`` as they are, unpacked ``[1, C, F', Y, X]`` normalised and packed
        (diffusers' ``prepare_latents``); audio: packed ``[1, La, Ca]`` or unpacked
        ``[1, c, La, M]`` packed, then normalised (``prepare_audio_latents``)."""
        from ditax.models.ltx2.audio.latents import pack_audio_latents

        if latents is None and audio_latents is None:
            return None
        if latents is None or audio_latents is None:
            raise RequestError("latents and audio_latents go together (the two streams start "
                               "from one draw); give both, or neither to draw them from seed")
        tc = self.transformer.config
        v = np.asarray(latents, np.float32)
        f, y, x = grid
        if v.ndim == 5:
            if v.shape[1:] != (tc.in_channels, f, y, x):
                raise RequestError(f"latents shape {v.shape} does not match "
                                   f"{(1, tc.in_channels, f, y, x)} for this request")
            z = np.asarray(self.vae.normalize_latents(jnp.asarray(v)))
            v = z.transpose(0, 2, 3, 4, 1).reshape(z.shape[0], f * y * x, -1)
        if v.shape[1:] != (f * y * x, tc.in_channels):
            raise RequestError(f"latents shape {v.shape} does not match the packed "
                               f"{(1, f * y * x, tc.in_channels)} for this request")
        a = np.asarray(audio_latents, np.float32)
        if a.ndim == 4:
            a = np.asarray(pack_audio_latents(jnp.asarray(a)))
        if a.shape[1:] != (la, tc.audio_in_channels):
            raise RequestError(f"audio_latents shape {a.shape} does not match the packed "
                               f"{(1, la, tc.audio_in_channels)} (or unpacked [1, C, {la}, "
                               f"{mel}]) for this request")
        a = np.asarray(self.audio_vae.normalize_latents(jnp.asarray(a)))
        return np.concatenate([v.reshape(v.shape[0], -1), a.reshape(a.shape[0], -1)], 1)

    @staticmethod
    def _renoised(given, noise_scale: float, seed: int, n: int):
        """diffusers' ``_create_noised_state`` on the joint start ``[1, N]``: ``s noise + (1 -
        s) given``, the noise drawn as a fresh start from ``seed``."""
        from ditax.pipelines.sampling import initial_noise

        noise = np.asarray(initial_noise(seed, (1, n)), np.float32)
        s = np.float32(noise_scale)
        return s * noise + (np.float32(1) - s) * np.asarray(given, np.float32)

    def _image_start(self, pixels, seed: int, n: int, grid, given):
        """The joint start ``[1, N]``: the given (or seed-drawn) latents with the first latent
        frame's video tokens replaced by the image's normalised VAE latent (the encoder's
        posterior mean, diffusers' ``argmax``). Normalised as diffusers' image-to-video
        pipeline does it: ``(z - mean) / std``, without the VAE's ``scaling_factor`` (1 in
        the published VAEs, where the two agree)."""
        from ditax.pipelines.sampling import initial_noise

        z = self.vae.standardize_latents(
            self.vae.encode(jnp.asarray(pixels, self.vae.dtype)).astype(jnp.float32))
        tokens = np.asarray(z, np.float32)[:, :, :1].transpose(0, 2, 3, 4, 1).reshape(1, -1)
        start = np.array(initial_noise(seed, (1, n)) if given is None else given, np.float32)
        start[:, :tokens.shape[1]] = tokens
        return start

    def decode(self, x, grid, la: int, seed: int, d: dict, o):
        """The joint latents ``[1, N]`` → ``{"video", "audio"}`` (module docstring, step 4;
        ``d``: the call's defaults filled in, ``o``: its :func:`call_options`)."""
        from ditax.io.audio import AudioTrack
        from ditax.models.ltx2.audio.latents import unpack_audio_latents

        tc = self.transformer.config
        f, y, xw = grid
        x = jnp.asarray(x, jnp.float32)
        lv = f * y * xw * tc.in_channels
        video = x[:, :lv].reshape(1, f, y, xw, tc.in_channels).transpose(0, 4, 1, 2, 3)
        tokens = x[:, lv:].reshape(1, la, tc.audio_in_channels)
        mel_bins = self.audio_vae.config.latent_mel_bins
        sound = unpack_audio_latents(self.audio_vae.denormalize_latents(tokens), mel_bins, la)
        if o.output == "latent":
            return {"video": np.asarray(self.vae.denormalize_latents(video)),
                    "audio": np.asarray(sound)}
        key = jax.random.fold_in(jax.random.PRNGKey(int(seed)), 1)   # the decode's noise
        z, t = self.vae.decode_inputs(
            video.astype(self.vae.dtype), decode_timestep=d["decode_timestep"],
            decode_noise_scale=o.decode_noise_scale,
            key=key if self.vae.timestep_conditioning else None)
        out = {"video": self.decode_pixels(z, t)}                        # [F, H, W, 3]
        if o.audio:
            mel = self.audio_vae.decode(sound.astype(self.audio_vae.dtype))
            wave = np.asarray(self.vocoder(mel), np.float32)[0]         # [channels, samples]
            check_finite(wave, "decode", "the sound track")
            out["audio"] = AudioTrack(wave, self.vocoder.sample_rate)
        return out


__all__ = ["LTX2Video", "OPTIONS", "STG_BLOCKS", "call_options", "guidance_scales"]
