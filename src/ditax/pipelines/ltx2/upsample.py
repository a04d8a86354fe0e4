"""LTX-2's latent upsample pipeline (diffusers ``LTX2LatentUpsamplePipeline``): raw video
latents ``[B, C, F, Y, X]`` (what :class:`~ditax.pipelines.ltx2.video.LTX2Video` returns with
``output="latent"``) → the same video's latents on the upsampler's finer grid, or that video
decoded. The middle of LTX-2's two-stage sampling (:mod:`.two_stage`).

The folder holds ``latent_upsampler/`` (``LTX2LatentUpsamplerModel``,
:mod:`ditax.models.ltx2.upsampler`) and ``vae/`` (the video VAE: its statistics for
normalised input, and the decoder for ``output="video"``). As diffusers' call:

1. latents given normalised (``latents_normalized=True``) are denormalised first — the
   upsampler was trained on the VAE's raw latents;
2. the upsampler;
3. ``adain_factor > 0``: each (sample, channel) of the result moved toward the input's mean
   and (unbiased) standard deviation, by that factor (``lerp``);
4. ``tone_map_compression_ratio > 0``: ``x (1 - 0.8 s sigmoid(4 s (|x| - 1)))`` with ``s =
   0.75 ratio``, large values pulled in;
5. ``output="latent"``: those raw latents; ``"video"``: decoded as the LTX-2 pipeline decodes
   (noised toward ``decode_noise_scale`` at ``decode_timestep`` for a timestep-conditioned
   VAE), ``[F, H, W, 3]`` in [0, 1] (batch 1) or ``[B, F, H, W, 3]``.

diffusers' ``video=`` (pixels to encode first) and packed ``[B, L, C]`` latents are not taken:
give unpacked latents.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ditax.errors import ConfigError, RequestError

PIPELINE_CLASS = "LTX2LatentUpsamplePipeline"
COMPONENTS = ("latent_upsampler", "vae")


def folder_class(path) -> str | None:
    """The ``_class_name`` of ``path``'s ``model_index.json`` (None: none readable there)."""
    import pathlib

    from ditax.io.files import read_model_json

    index = pathlib.Path(path) / "model_index.json"
    if not index.is_file():
        return None
    raw = read_model_json(index, "model_index.json")
    return raw.get("_class_name") if isinstance(raw, dict) else None


def adain(latents: jax.Array, reference: jax.Array, factor: float) -> jax.Array:
    """``latents`` ``[B, C, ...]`` with each ``(b, c)`` slice renormalised to ``reference``'s
    mean and unbiased std, blended in by ``factor`` (diffusers' ``adain_filter_latent``)."""
    axes = tuple(range(2, latents.ndim))

    def stats(x):
        return jnp.mean(x, axes, keepdims=True), jnp.std(x, axes, keepdims=True, ddof=1)

    m, s = stats(latents)
    rm, rs = stats(reference)
    moved = (latents - m) / s * rs + rm
    return latents + factor * (moved - latents)


def tone_map(latents: jax.Array, compression: float) -> jax.Array:
    """diffusers' ``tone_map_latents``: values past 1 scaled down smoothly, by up to ``0.6``
    at ``compression=1``; ``compression=0`` is the identity."""
    s = compression * 0.75
    return latents * (1.0 - 0.8 * s * jax.nn.sigmoid(4.0 * s * (jnp.abs(latents) - 1.0)))


class LTX2LatentUpsample:
    """A loaded ``LTX2LatentUpsamplePipeline`` folder; call it with raw video latents. See
    :func:`load_upsample_pipeline`."""

    def __init__(self, *, upsampler, vae, vae_tiling: bool = False):
        self.upsampler, self.vae, self.vae_tiling = upsampler, vae, vae_tiling
        self.vae_parallel = None    # a mesh: decode with the rows split over it (load_pipeline)
        self.config = upsampler.config
        self.load_time = 0.0
        graphdef, state = nnx.split(upsampler)
        self._state = state
        self._run = jax.jit(lambda st, x: nnx.merge(graphdef, st)(x))

    def __call__(self, latents, *, latents_normalized: bool = False, adain_factor: float = 0.0,
                 tone_map_compression_ratio: float = 0.0, output: str = "latent",
                 decode_timestep: float = 0.0, decode_noise_scale: float | None = None,
                 seed: int = 0, progress: bool = False):
        """Latents ``[B, C, F, Y, X]`` → upsampled raw latents (numpy, ``output="latent"``) or
        the decoded video (``"video"``); the module docstring has the steps. ``seed``: the
        decode noise of a timestep-conditioned VAE. ``progress`` is accepted for the common
        call and unused (one program)."""
        z = self._check(latents, adain_factor, tone_map_compression_ratio, output,
                        decode_timestep, decode_noise_scale)
        if latents_normalized:
            z = self.vae.denormalize_latents(z)
        up = self._run(self._state, z.astype(self.upsampler.dtype)).astype(jnp.float32)
        if adain_factor > 0.0:
            up = adain(up, z, float(adain_factor))
        if tone_map_compression_ratio > 0.0:
            up = tone_map(up, float(tone_map_compression_ratio))
        if output == "latent":
            return np.asarray(up)
        return self.decode(up, decode_timestep, decode_noise_scale, seed)

    def _check(self, latents, adain_factor, tone_map_compression_ratio, output,
               decode_timestep, decode_noise_scale) -> jax.Array:
        c = self.config.in_channels
        if output not in ("latent", "video"):
            raise RequestError(f"output={output!r}; use 'latent' or 'video'")
        if not -10.0 <= float(adain_factor) <= 10.0:
            raise RequestError(f"adain_factor={adain_factor} is outside [-10, 10] (0: off)")
        if not 0.0 <= float(tone_map_compression_ratio) <= 1.0:
            raise RequestError(f"tone_map_compression_ratio={tone_map_compression_ratio} is "
                               f"outside [0, 1] (0: off)")
        for name, v in (("decode_timestep", decode_timestep),
                        ("decode_noise_scale", decode_noise_scale)):
            if v is not None and not 0.0 <= float(v) <= 1.0:
                raise RequestError(f"{name}={v} is outside [0, 1]")
        z = np.asarray(latents, np.float32)
        if z.ndim != 5 or z.shape[1] != c:
            raise RequestError(f"latents shape {z.shape}: the latent upsampler takes unpacked "
                               f"video latents [B, {c}, F, Y, X] (LTX2Video's output='latent')")
        if not np.isfinite(z).all():
            raise RequestError("latents hold NaN or inf values")
        return jnp.asarray(z)

    def decode(self, latents: jax.Array, decode_timestep, decode_noise_scale, seed: int):
        """Raw latents → video in [0, 1], ``[F, H, W, 3]`` for one sample, else ``[B, ...]``."""
        t = None
        if self.vae.timestep_conditioning:
            t = jnp.full((latents.shape[0],), float(decode_timestep), jnp.float32)
            s = float(decode_timestep if decode_noise_scale is None else decode_noise_scale)
            noise = jax.random.normal(jax.random.PRNGKey(int(seed)), latents.shape, jnp.float32)
            latents = (1.0 - s) * latents + s * noise
        from ditax.models.vae.parallel import decode_on      # vae_parallel: rows over the mesh

        frames = decode_on(self.vae, latents.astype(self.vae.dtype), self.vae_parallel, t,
                           tiled=self.vae_tiling)
        frames = np.clip(np.asarray(frames, np.float32) / np.float32(2) + np.float32(0.5),
                         np.float32(0), np.float32(1)).transpose(0, 2, 3, 4, 1)
        return np.ascontiguousarray(frames[0] if frames.shape[0] == 1 else frames)


def load_upsample_pipeline(path, dtype: str = "float32", mesh=None, attention=None,
                           vae_tiling: bool = False, **options) -> LTX2LatentUpsample:
    """The :class:`LTX2LatentUpsample` of an ``LTX2LatentUpsamplePipeline`` folder (or hub id)
    ``path``, its parts in ``dtype`` on one device (``mesh`` / ``attention``: accepted for the
    common loader, unused — nothing here attends). ``vae_tiling``: decode in tiles."""
    from ditax.models.ltx2.upsampler.convert import load_latent_upsampler
    from ditax.models.vae.ltx2 import load_ltx2_video_vae
    from ditax.pipelines.family import resolve

    if options:
        raise ConfigError(f"{sorted(options)}: not options of a latent upsampler folder "
                          f"({PIPELINE_CLASS}); it takes dtype= and vae_tiling=")
    t0 = time.perf_counter()
    root = resolve(path)
    cls = folder_class(root)
    if cls != PIPELINE_CLASS:
        raise ConfigError(f"{root}: model_index.json _class_name={cls!r}; expected an "
                          f"{PIPELINE_CLASS} folder (latent_upsampler/ + vae/)")
    missing = [c + "/" for c in COMPONENTS if not (root / c).is_dir()]
    if missing:
        raise ConfigError(f"{root} lacks {', '.join(missing)}: an {PIPELINE_CLASS} folder holds "
                          f"latent_upsampler/ and vae/ (diffusers' save_pretrained)")
    upsampler = load_latent_upsampler(root / "latent_upsampler", dtype)
    vae = load_ltx2_video_vae(root, dtype)
    if vae.latent_channels != upsampler.config.in_channels:
        raise ConfigError(f"{root}: vae latent_channels = {vae.latent_channels} but the latent "
                          f"upsampler's in_channels = {upsampler.config.in_channels}; the folder "
                          f"mixes components of different models")
    pipe = LTX2LatentUpsample(upsampler=upsampler, vae=vae, vae_tiling=vae_tiling)
    pipe.load_time = time.perf_counter() - t0
    return pipe


__all__ = ["COMPONENTS", "LTX2LatentUpsample", "PIPELINE_CLASS", "adain", "folder_class",
           "load_upsample_pipeline", "tone_map"]
