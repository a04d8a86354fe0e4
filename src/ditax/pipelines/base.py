"""The runtime state every family's pipeline holds, in one base class, and the request checks
that every family's ``prepare`` shares.

A family's pipeline (Wan's text-, image-, video-to-video, VACE and Animate; FLUX.1; FLUX.2;
LTX-2) is a :class:`Pipeline`: beside its own components it holds what the generic loop
(:mod:`.sampling`) and the server's batches (:mod:`.batch`, :mod:`.continuous`) read —

- ``vae``, ``transformer`` (``mesh`` is its mesh, ``dtype`` its compute dtype) and
  ``scheduler``;
- ``cfg_mode``, checked here (:func:`~ditax.pipelines.options.check_cfg_mode`, the check its
  loader runs before any file is read);
- ``programs`` (:class:`~ditax.pipelines.programs.Programs`: the compiled step and decode
  programs by signature) and ``compile_cache`` (jax's persistent cache: ``"auto"``, ``"none"``
  or a folder; :func:`~ditax.pipelines.programs.in_compile_cache`);
- ``vae_tiling`` and ``vae_parallel`` (a mesh: the decode's rows split over it, set by
  ``load_pipeline(vae_parallel=True)``): how :meth:`Pipeline.decode_pixels` decodes
  (``vae_tiling`` None, the default: whole, or in tiles where the VAE's plan says the whole
  decode does not fit the device: :meth:`Pipeline.decode_options`);
- ``sample_defaults`` (the folder's ``ditax_sample.json``, a LoRA's sampling settings over it:
  :meth:`Pipeline.take_lora_sample`; a call reads them with :meth:`Pipeline.call_defaults`);
- ``load_time``, ``timings`` and ``last_stats``: what loading and the last call took and ran.

A family's subclass names its ``family`` (the registry name whose sample defaults fill what a
call leaves out), its ``denoiser`` (the module that puts ``transformer.module`` behind the
denoiser protocol: :meth:`Pipeline.experts`; Wan's transformers are their own) and writes
``prepare(**call)``: the request checked and laid out as a
:class:`~ditax.pipelines.sampling.Prepared`, whose runtime fields :meth:`Pipeline.prepared`
fills in; its call is ``record(self, self.prepare(...).run(progress))``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from ditax.errors import RequestError
from ditax.pipelines.options import check_cfg_mode
from ditax.pipelines.programs import Programs
from ditax.pipelines.sampling import Expert, Prepared, Timings

#: the generic loop's step-cache arguments of a call (:mod:`ditax.pipelines.cache`), passed
#: through to :class:`~ditax.pipelines.sampling.Prepared` as they are, with their defaults
STEP_CACHE = {"cache": None, "cache_threshold": None, "cfg_cache": False,
              "cache_coefficients": None}


class Pipeline:
    """A loaded pipeline's runtime state (module docstring)."""

    #: the family's registry name (:meth:`call_defaults` reads its sample defaults)
    family: ClassVar[str] = ""
    #: ``denoiser(transformer.module)``: the denoiser the loop runs (None: the subclass's
    #: :meth:`experts` build their own)
    denoiser: ClassVar[Callable | None] = None
    #: whether requests of one shape stack (:mod:`ditax.pipelines.batch`)
    batches: ClassVar[bool] = True
    #: whether a call takes ``frames_to=`` (:meth:`hand_frames`: the decoded video handed over
    #: as it is decoded; ``ditax generate`` encodes the mp4 meanwhile)
    hands_frames: ClassVar[bool] = False

    def __init__(self, *, vae, transformer, scheduler, cfg_mode: str = "batched",
                 vae_tiling: bool | None = None, sample_defaults: dict | None = None):
        check_cfg_mode(cfg_mode)
        self.vae, self.transformer, self.scheduler = vae, transformer, scheduler
        self.cfg_mode = cfg_mode
        self.vae_tiling = vae_tiling   # None: chosen per decode (decode_options)
        self.vae_parallel = None    # a mesh: decode with the rows split over it (load_pipeline)
        self.sample_defaults = dict(sample_defaults or {})   # the folder's ditax_sample.json
        self.load_time = 0.0
        self.timings = Timings()
        self.compile_cache = "auto"   # see ditax.compile_cache; "none" = off
        self.programs = Programs()
        self.last_stats: dict = {}   # after each call: steps, transformer_calls, ... (step_cache)
        self._expert = None
        if self.denoiser is not None:
            from flax import nnx

            self._expert = Expert(*nnx.split(self.denoiser(transformer.module)),
                                  transformer.config)

    @property
    def mesh(self):
        """The transformer's mesh (None: one device); the transformer holds it."""
        return self.transformer.mesh

    @property
    def dtype(self):
        """The transformer's compute dtype: what the text, image and control conditions are
        cast to."""
        import jax.numpy as jnp

        return jnp.dtype(self.transformer.config.dtype)

    def experts(self) -> list[Expert]:
        """The denoisers the loop may call (:class:`~ditax.pipelines.sampling.Expert`)."""
        return [self._expert]

    def call_defaults(self, **call) -> dict:
        """``call`` with each value left at None taken from ``self.sample_defaults`` (the
        folder's ``ditax_sample.json``, a LoRA's settings over it), else the family's
        (:attr:`ditax.pipelines.family.PipelineFamily.sample_defaults`)."""
        from ditax.pipelines.family import pipelines_of   # the family, as the registry names it
        from ditax.pipelines.sample_defaults import with_defaults

        return with_defaults(call, self.sample_defaults, pipelines_of(self.family).sample_defaults)

    def take_lora_sample(self, lora_sample) -> None:
        """A LoRA's sampling settings (:class:`~ditax.pipelines.lora_sample.LoraSample`; None:
        none) over ``sample_defaults``: its steps, guidance, ..., and its ``sigmas`` only where
        the scheduler is the Euler sampler that takes them."""
        if lora_sample is None:
            return
        from ditax.schedulers.flow_match import FlowMatchEulerScheduler

        self.sample_defaults.update(lora_sample.call_defaults(
            euler=isinstance(self.scheduler, FlowMatchEulerScheduler)))

    def prepared(self, **parts) -> Prepared:
        """A request's :class:`~ditax.pipelines.sampling.Prepared` from its ``parts``, with this
        pipeline's runtime fields (``programs``, ``experts``, ``mesh``, ``cfg_mode``) where
        ``parts`` does not name them."""
        runtime = dict(programs=self.programs, experts=self.experts(), mesh=self.mesh,
                       cfg_mode=self.cfg_mode)
        return Prepared(**{**runtime, **parts})

    def decode_options(self, shape) -> dict:
        """How latents of ``shape`` decode (``{"tiled": ...}``): ``vae_tiling`` where set,
        else whole unless the VAE's plan says the whole decode does not fit the device (then in
        tiles, logged in one line; a :class:`RequestError` where tiles do not fit either):
        :func:`ditax.pipelines.decode_fit.decode_options`. Ask it before any work (a
        ``prepare``) and pass its options to :meth:`vae_decode`."""
        from ditax.pipelines.decode_fit import decode_options

        return decode_options(self, shape)

    def vae_decode(self, z, *conditions, **options):
        """The VAE's decode of latents ``z`` as the pipeline runs it (``vae_parallel``: rows
        split over that mesh; else tiled or not: ``options``' ``tiled`` where given, else
        :meth:`decode_options`'; ``options`` such as ``programs=``); the raw ``[B, 3, ...]``
        pixels in about [-1, 1]. ``conditions``: the decode's further inputs (LTX-2's
        timestep)."""
        from ditax.models.vae.parallel import decode_on

        if "tiled" not in options:
            options = {**self.decode_options(z.shape), **options}
        return decode_on(self.vae, z, self.vae_parallel, *conditions, **options)

    def decode_pixels(self, z, *conditions, **options) -> np.ndarray:
        """:meth:`vae_decode`'s first row as float32 ``[..., 3]`` (channels last) in [0, 1]
        (:func:`to_unit`'s values, converted a frame at a time:
        :func:`ditax.io.frames.unit_pixels`)."""
        from ditax.io.frames import unit_pixels

        return unit_pixels(self.vae_decode(z, *conditions, **options))


    def hand_frames(self, z, frames_to, **options) -> np.ndarray:
        """:meth:`decode_pixels`' video of latents ``z`` (``options``: its), handed to
        ``frames_to`` (an :class:`~ditax.io.video_stream.Mp4Stream`, or any object with its
        ``put`` / ``whole``) as it is decoded: ``frames_to.put(frames)`` with each decode
        step's float32 ``[f, H, W, 3]`` in [0, 1], in order and once checked finite (a NaN
        never reaches the encoder), where the VAE decodes in steps (``decode_chunks`` and
        ``frames_of``: the Wan VAE) whole on one device; else (:func:`whole_reason`) decoded
        whole and ``frames_to.whole(reason)`` told why. The same values either way (one
        float32 array, each step's frames written into their slice)."""
        from ditax.io.frames import unit_pixels
        from ditax.pipelines.sampling import check_finite

        reason = whole_reason(self.vae, self.vae_parallel, options)
        if reason is not None:
            frames_to.whole(reason)
            return self.decode_pixels(z, **options)
        out, at = None, 0
        for pixels in self.vae.decode_chunks(z, programs=options.get("programs")):
            if out is None:         # the video's frames, each step's written in its slice
                _, c, _, h, w = pixels.shape
                out = np.empty((self.vae.frames_of(z.shape[2]), h, w, c), np.float32)
            frames = unit_pixels(pixels, out[at:at + pixels.shape[2]])
            at += len(frames)
            check_finite(frames, "decode", "the decoded output")
            frames_to.put(frames)
        return out


def whole_reason(vae, parallel, options: dict) -> str | None:
    """Why a decode (``options``: :meth:`Pipeline.decode_options`'; ``parallel``: the
    pipeline's ``vae_parallel``) cannot hand its frames over in steps (None: it can)."""
    if not hasattr(vae, "decode_chunks"):
        return f"{type(vae).__name__} decodes the video whole"
    if parallel is not None:
        return "the decode's rows are split over the mesh (sample.vae_parallel)"
    if options.get("tiled"):
        return "the decode runs in spatial tiles (sample.vae_tiling, or a whole decode's fit)"
    return None


def to_unit(pixels) -> np.ndarray:
    """A decode's pixels as float32 in [0, 1]: ``x / 2 + 0.5`` clipped, on the host (the same
    float32 arithmetic as on the device, without compiling more programs)."""
    x = np.asarray(pixels, np.float32)
    return np.clip(x / np.float32(2) + np.float32(0.5), np.float32(0), np.float32(1))


def channels_last(x) -> np.ndarray:
    """The first row of ``[B, C, ...]`` as a contiguous ``[..., C]``."""
    return np.ascontiguousarray(np.moveaxis(np.asarray(x)[0], 0, -1))


def check_output(output, kinds: tuple[str, ...]) -> None:
    """``output`` is one of ``kinds`` (the decoded kind, or ``"latent"``)."""
    if output not in kinds:
        raise RequestError(f"output={output!r}; use {' or '.join(map(repr, kinds))}")


def euler_sigmas(sigmas, steps: int, default=None) -> np.ndarray:
    """The request's Euler sigmas as float64 ``[steps]``: ``sigmas``, else ``default``, else
    ``linspace(1, 1/N, N)``, checked (:func:`~ditax.schedulers.flow_match.check_sigmas`; a
    bad list is one :class:`RequestError`)."""
    from ditax.schedulers.flow_match import check_sigmas

    if sigmas is None:
        sigmas = default
    if sigmas is None:
        sigmas = np.linspace(1.0, 1.0 / steps, steps)
    try:
        check_sigmas(sigmas, steps)
    except ValueError as e:
        raise RequestError(str(e)) from None
    return np.asarray(sigmas, np.float64)


def step_cache_options(call: dict) -> dict[str, Any]:
    """The step-cache arguments (:data:`STEP_CACHE`) taken out of ``call``, defaults filled."""
    return {k: call.pop(k, v) for k, v in STEP_CACHE.items()}


__all__ = ["Pipeline", "STEP_CACHE", "channels_last", "check_output", "euler_sigmas",
           "step_cache_options", "to_unit", "whole_reason"]
