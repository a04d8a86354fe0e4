"""LTX-2's transformer as the generic sampling loop calls a denoiser, its rule for a step's
inputs, and its guidance rule.

The loop carries one latent array per request and steps it with the scheduler, which is
elementwise. LTX-2 denoises two streams at the same noise level, so its latents are the two
packed token arrays laid end to end, ``x [B, L*C + La*Ca]`` (video tokens ``[B, L, C]``, then
audio tokens ``[B, La, Ca]``, each flattened row-major): one Euler step on ``x`` is diffusers'
two scheduler steps (its video and audio schedulers are copies with the same sigmas), and
batching, the compile cache and the server's continuous batches see one array as for any
family. :class:`LTX2Denoiser` splits ``x`` for the transformer and joins its two velocities.

``text`` is ``(video_text [n, T, D], audio_text [n, T, Da], mask [n, T])``, cond then uncond.
The extras (a request's condition, with a leading batch axis): the RoPE positions of its
sizes (computed on the host once), its guidance scales (``[1]`` each, read by the guidance
rule, not by the transformer) and, for image-to-video, ``cond_mask [1, L]`` (1 on the
conditioning frame's tokens: their timestep is 0 and their velocity is zeroed, so the Euler
step keeps them exactly, as diffusers steps only the other frames).

The guidance is LTX-2's own (:mod:`ditax.pipelines.ltx2.guidance`): the rule
(:func:`ltx2_inputs`) carries, as static facts of the step program, which extra branches run —
spatio-temporal guidance (its blocks) and modality isolation — each a further forward of the
conditional rows.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax.numpy as jnp

from ditax.models.ltx2.transformer.blocks import AUDIO, VIDEO
from ditax.pipelines.denoise import text_rows
from ditax.pipelines.ltx2.guidance import Scales, guided_velocity
from ditax.pipelines.wrapped import WrappedTransformer

#: the per-request guidance scales the condition carries (``[1]`` float32 each)
SCALES = ("guidance", "audio_guidance", "stg", "audio_stg", "modality", "audio_modality",
          "rescale", "audio_rescale")


class Context(NamedTuple):
    """What :meth:`LTX2Denoiser.embed` hands its blocks and head: the transformer's own
    context (``inner``), and the fields the step cache reads (:class:`~ditax.models.base
    .Embedded`): ``seq`` the real tokens of each stream ``(L, La)`` (the video's padding past
    ``L``), ``mod`` the blocks' video timestep terms, ``temb`` the video time embedding."""

    inner: Any
    seq: tuple[int, int]
    mod: Any
    temb: Any


class LTX2Denoiser(WrappedTransformer):
    """:class:`~ditax.models.ltx2.transformer.model.LTX2Transformer` behind the denoiser protocol:
    ``x [B, L*C + La*Ca]`` (module docstring), ``timestep [B]`` (0..1000, also the prompt
    modulation's ``sigma``), ``text = (video_text, audio_text, mask)``, extras ``positions``
    (:class:`~ditax.models.ltx2.transformer.rope.Positions`, batch 1 or B), ``cond_mask`` (``[B, L]``
    or None) and ``scales`` (ignored here).
    ``stg_blocks``: perturb these blocks' self-attention (a tuple; None: none);
    ``isolate``: no audio<->video attention. ``use_cross_timestep``: diffusers' pipeline
    flag (the a<->v attention modulated by the other stream's sigma).

    Its forward is ``head(run_blocks(*embed(...)))`` (the protocol of
    :class:`~ditax.models.base.Denoiser`, so the step cache reaches it): the tokens are the
    pair ``(video, audio)``, laid out by :attr:`token_axes`."""

    #: the logical axes of the tokens ``(video, audio)`` (audio replicated over ``context``)
    token_axes = (VIDEO, AUDIO)

    def __init__(self, transformer, use_cross_timestep: bool = True):
        super().__init__(transformer)
        self.use_cross_timestep = use_cross_timestep

    def split(self, x, positions):
        """``x [B, N]`` → ``(video [B, L, C], audio [B, La, Ca])`` (``L``, ``La`` from the
        positions' token axes)."""
        cfg = self.cfg
        b, lv, la = x.shape[0], positions.video.shape[1], positions.audio.shape[1]
        n = lv * cfg.in_channels
        return (x[:, :n].reshape(b, lv, cfg.in_channels),
                x[:, n:].reshape(b, la, cfg.audio_in_channels))

    @staticmethod
    def join(video, audio):
        b = video.shape[0]
        return jnp.concatenate([video.reshape(b, -1), audio.reshape(b, -1)], axis=1)

    def __call__(self, x, timestep, text, *, positions, scales=None, cond_mask=None,
                 stg_blocks=None, isolate: bool = False):
        h, ctx = self.embed(x, timestep, text, positions=positions, scales=scales,
                            cond_mask=cond_mask, stg_blocks=stg_blocks, isolate=isolate)
        return self.head(self.run_blocks(h, ctx), ctx)

    def embed(self, x, timestep, text, *, positions, scales=None, cond_mask=None,
              stg_blocks=None, isolate: bool = False):
        """Tokens ``h = (video [B, L', D], audio [B, La, Da])`` and the context
        (:class:`Context`) of the call's arguments (the class docstring)."""
        video, audio = self.split(x, positions)
        video_text, audio_text, mask = text
        video_t = timestep
        if cond_mask is not None:     # image-to-video: the clean first frame at timestep 0
            video_t = timestep[:, None] * (1.0 - cond_mask.astype(jnp.float32))
        h, inner = self.transformer.embed(
            video, audio, video_text, audio_text, video_t, audio_timestep=timestep,
            sigma=timestep,
            encoder_attention_mask=mask, audio_encoder_attention_mask=mask,
            positions=positions, isolate_modalities=isolate,
            spatio_temporal_guidance_blocks=None if stg_blocks is None else list(stg_blocks),
            use_cross_timestep=self.use_cross_timestep)
        return h, Context(inner, (inner.seq, audio.shape[1]), inner.mod, inner.temb)

    def run_blocks(self, h, ctx, start: int = 0, stop: int | None = None):
        """Blocks ``start .. stop-1`` (default all) on both streams."""
        return self.transformer.run_blocks(h, ctx.inner, start, stop)

    def head(self, h, ctx):
        """Both streams' output layers, joined: ``[B, L*C + La*Ca]`` float32."""
        out_v, out_a = self.transformer.head(h, ctx.inner)
        return self.replicated(self.join(out_v.astype(jnp.float32), out_a.astype(jnp.float32)))


def _inputs(model, condition, latents, t):
    """``(x [B, N] float32, timestep [B] = t, extras)``: the joint latents as they are (the
    denoiser casts each stream; the guidance needs them in float32), the scheduler's
    timestep (0..1000, what diffusers' pipeline feeds) and the request's condition."""
    b = latents.shape[0]
    t = jnp.asarray(t, jnp.float32)
    timestep = jnp.broadcast_to(t.reshape(-1), (b,)) if t.ndim <= 1 else t
    return latents.astype(jnp.float32), timestep, dict(condition)


def _guide(stg_blocks, modality: bool, model, step_in, text, cond, uncond, guidance):
    """LTX-2's guidance at one step (:func:`~ditax.pipelines.ltx2.guidance.guided_velocity`
    on each stream), running the static extra branches on the conditional rows."""
    x, tb, extras = step_in
    b = x.shape[0]
    positions, s = extras["positions"], extras["scales"]
    text_c = text_rows(text, slice(0, b))
    perturbed = isolated = None
    if stg_blocks is not None:
        perturbed = model(x, tb, text_c, **extras, stg_blocks=stg_blocks)
    if modality:
        isolated = model(x, tb, text_c, **extras, isolate=True)
    sigma = tb.astype(jnp.float32) / jnp.float32(1000)
    parts = [model.split(a, positions) if a is not None else (None, None)
             for a in (x, cond, uncond, perturbed, isolated)]
    (xv, xa), (cv, ca), (uv, ua), (pv, pa), (iv, ia) = parts
    video = guided_velocity(xv, sigma, cv, Scales(s["guidance"], s["stg"], s["modality"],
                                                  s["rescale"]), uv, pv, iv)
    if extras.get("cond_mask") is not None:    # the conditioning frame's tokens stay as given
        video = video * (1.0 - extras["cond_mask"].astype(jnp.float32))[..., None]
    audio = guided_velocity(xa, sigma, ca, Scales(s["audio_guidance"], s["audio_stg"],
                                                  s["audio_modality"], s["audio_rescale"]),
                            ua, pa, ia)
    return model.join(video, audio)


@functools.lru_cache(maxsize=None)
def ltx2_inputs(stg_blocks: tuple[int, ...] | None, modality: bool):
    """The inputs rule of a request whose guidance runs spatio-temporal guidance on
    ``stg_blocks`` (None: not) and modality isolation (``modality``): one function object
    per combination (a static argument of the step program, hashed by identity), carrying
    its guidance rule as ``.guide`` (:func:`ditax.pipelines.denoise.guide_rule`)."""
    def inputs(model, condition, latents, t):
        return _inputs(model, condition, latents, t)
    inputs.guide = functools.partial(_guide, stg_blocks, modality)
    # the further forwards of the conditional rows the guide runs, in its order (the step
    # cache keeps a cache entry for each, as for a CFG branch)
    inputs.extra_branches = (("stg",) if stg_blocks is not None else ()) + (
        ("modality",) if modality else ())
    inputs.__qualname__ = f"ltx2_inputs(stg={stg_blocks}, modality={modality})"
    return inputs


__all__ = ["Context", "LTX2Denoiser", "SCALES", "ltx2_inputs"]
