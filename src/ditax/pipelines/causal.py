"""Causal sampling (issue 59): a video made chunk by chunk of latent frames, each chunk in a
few flow-matching Euler steps attending to the KV cache of the clean chunks before it, and
streamed as it is made — for videos longer than the model was trained on.

Per chunk ``i`` (one compiled program, :func:`_chunk_program`, the same for every chunk):

1. the chunk's noise is denoised in the scheduler's ``S`` steps; every step is one forward
   of the chunk's tokens alone (``causal.forward_chunk(..., write=False)``) attending to the
   cache (the sink + the last ``context_chunks`` clean chunks) and itself, with CFG when
   ``guidance_scale > 1`` (cond and uncond rows in one batch, each row its own cache);
2. the clean chunk's keys / values are written into the cache by one more forward of the
   denoised chunk **at t = 0** (as CausVid and Self-Forcing's ``context_noise=0``: the cache
   holds what a clean chunk looks like, not the last step's noisy one); the cache is donated
   and comes back with its write index advanced.

The cache is a pytree of preallocated arrays (the family's ``init_cache``) whose shapes do
not change with the video's length, so chunk 100 runs the program chunk 1 compiled.

Step caching (``cache=`` "first_block" | "teacache" | "magcache", as the bidirectional loop's,
:mod:`ditax.pipelines.cache`): inside a chunk, a step may reuse the residual of the blocks of
the chunk's last computed step (the method's rule decides on the device, per step); the first
step of every chunk always runs (the chunk's tokens are new), the cache write at t = 0 too.
The step cache's forward runs the denoiser protocol (``embed`` / ``run_blocks`` / ``head``)
of :class:`ChunkDenoiser`: the model on the chunk against the read-only KV cache.
``cfg_cache`` is not taken (its reuse steps run the conditional rows alone, whose cache rows
are half of the batch's).

The family is reached through ``causal``, any object with ``init_cache(model, batch,
chunk_shape, context_chunks)``, ``forward_chunk(model, x, timestep, text, cache, write=)``,
``embed_chunk(model, x, timestep, text, cache)``, ``chunk_blocks(model, h, ctx, cache, start,
stop)``, ``max_chunks(cfg, chunk)`` and ``check_causal(chunk, context_chunks, patch_t,
frames=)`` — a family's KV-cache module (Wan's: :mod:`ditax.models.wan.kv_cache`); nothing
here names a family.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Iterator, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ditax.errors import RequestError
from ditax.pipelines.cache.cached_step import cached_forward
from ditax.pipelines.cache.carry import init_carry
from ditax.pipelines.cache.step_cache import plan_step_cache
from ditax.pipelines.denoise import BOTH, COND, guide, scheduler_update
from ditax.pipelines.sampling import Expert, initial_noise, set_timesteps
from ditax.pipelines.wrapped import WrappedTransformer


class ChunkDenoiser(WrappedTransformer):
    """The causal ``transformer`` on the KV ``cache``'s next chunk (read, not written) as a
    denoiser (:class:`~ditax.models.denoiser.Denoiser`: ``embed`` / ``run_blocks`` /
    ``head``): what the step cache's forward
    (:func:`~ditax.pipelines.cache.cached_step.cached_forward`) runs on a chunk."""

    def __init__(self, transformer, causal, cache):
        super().__init__(transformer)
        self.causal, self.cache = causal, nnx.data(cache)

    def embed(self, x, timestep, text, **extras):
        return self.causal.embed_chunk(self.transformer, x, timestep, text, self.cache,
                                       **extras)

    def run_blocks(self, h, ctx, start: int = 0, stop: Optional[int] = None):
        return self.causal.chunk_blocks(self.transformer, h, ctx, self.cache, start, stop)[0]

    def head(self, h, ctx):
        return self.transformer.head(h, ctx)


def _chunk_inputs(model, condition, latents, t):
    """The step cache's input rule (:class:`~ditax.models.denoiser.ModelInputs`) of a chunk:
    the latents in the model dtype, the timestep per row; no condition."""
    return latents.astype(jnp.dtype(model.cfg.dtype)), jnp.broadcast_to(
        t, (latents.shape[0],)), {}


def _velocity(model, causal, use_cfg: bool, x, t, text, guidance, cache):
    """The guided prediction for the chunk ``x`` at ``t`` against ``cache`` (not written)."""
    b = x.shape[0]
    xin = x.astype(jnp.dtype(model.cfg.dtype))
    if use_cfg:
        xin = jnp.concatenate([xin, xin])
    out, _ = causal.forward_chunk(model, xin, jnp.broadcast_to(t, (xin.shape[0],)), text, cache,
                                  write=False)
    return guide(out[:b], out[b:], guidance) if use_cfg else out


def _cached_velocity(model, causal, policy, tables, use_cfg: bool, x, i, t, text, guidance,
                     cache, carry):
    """:func:`_velocity` through the step cache's forward (step ``i`` of the chunk, the
    method's ``tables`` and ``carry``): ``(prediction, carry)``."""
    den = ChunkDenoiser(model, causal, cache)
    dgdef, dparams = nnx.split(den)
    forward = cached_forward(dgdef, policy, tables, dparams, i)
    b = x.shape[0]
    xin, tb, _ = _chunk_inputs(den, None, x, t)
    if not use_cfg:
        return forward(xin, tb, text, {}, COND, carry)
    out, carry = forward(jnp.concatenate([xin, xin]), jnp.concatenate([tb, tb]), text, {},
                         BOTH, carry)
    return guide(out[:b], out[b:], guidance), carry


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4), donate_argnums=(9,))
def _chunk_program(gdef, causal, scheduler, use_cfg: bool, policy, params, sched_state, noise,
                   text, cache, guidance, tables=None, carry=None):
    """One chunk: ``S`` Euler steps from ``noise [B, C, F_c, Y, X]`` (float32) against the
    cache, then the clean chunk's K/V written at t = 0. Returns ``(latents, cache, carry)``;
    the step index lives in ``sched_state`` (traced), so one program serves every chunk.
    ``policy`` (None: every step runs), ``tables``, ``carry``: the step cache's."""
    def step(_, c):
        x, st, p, carry = c
        t = st.timesteps[st.step_index].astype(jnp.float32)
        # the weights ride in the carry: NNX refuses a module whose values are an outer
        # trace's inside the blocks' scan (loop-invariant, XLA does not copy them)
        model = nnx.merge(gdef, p)
        if policy is None:
            v = _velocity(model, causal, use_cfg, x, t, text, guidance, cache)
        else:
            v, carry = _cached_velocity(model, causal, policy, tables, use_cfg, x,
                                        st.step_index, t, text, guidance, cache, carry)
        return scheduler_update(scheduler, st, v, x) + (p, carry)

    steps = sched_state.timesteps.shape[0]
    x, _, _, carry = jax.lax.fori_loop(0, steps, step, (noise, sched_state, params, carry))
    model = nnx.merge(gdef, params)
    xin = x.astype(jnp.dtype(model.cfg.dtype))
    rows = text.shape[0]
    if use_cfg:
        xin = jnp.concatenate([xin, xin])
    _, cache = causal.forward_chunk(model, xin, jnp.zeros((rows,), jnp.float32), text, cache,
                                    write=True)
    return x, cache, carry


def compiled_chunk_programs() -> int:
    """How many chunk programs have been compiled in this process (a test's count)."""
    return _chunk_program._cache_size()


class CausalSampler:
    """Chunk-by-chunk sampling of a causal ``model`` (an NNX module with a KV-cache
    ``causal`` family module, see the module docstring).

    Args:
      model: the causal denoiser (e.g. a Wan transformer; its weights are the student's).
      causal: the family's KV-cache module (``init_cache`` / ``forward_chunk`` /
        ``max_chunks``).
      scheduler: the loop's sampler (flow-matching Euler for a few-step student, with its
        ``sigmas``; UniPC too: its history is per chunk, the state made for a chunk's shape).
      chunk: latent frames per chunk (``model.causal_chunk``).
      context_chunks: chunks kept beside the sink (``sample.context_chunks``); None: the
        whole video's (nothing evicted).
    """

    def __init__(self, model, causal, scheduler, chunk: int,
                 context_chunks: Optional[int] = None):
        self.gdef, self.params = nnx.split(model)
        self.model, self.causal, self.scheduler = model, causal, scheduler
        self.chunk, self.context_chunks = chunk, context_chunks
        self.last_stats: dict[str, Any] = {}

    def stream(self, text, *, num_frames: int, latent_hw: tuple[int, int],
               num_inference_steps: int, sigmas=None, guidance_scale: float = 1.0,
               seed: int = 0, latents=None, cache: Optional[str] = None,
               cache_threshold: Optional[float] = None,
               cache_coefficients=None) -> Iterator[jax.Array]:
        """Yield the clean latent chunks ``[B, C, chunk, Y, X]`` (float32) one by one, each
        as soon as it is made, for a video of ``num_frames`` latent frames (a multiple of
        ``chunk``; any number of chunks up to the RoPE table's).

        ``text``: the text embeddings ``[B, T, Dt]`` (with guidance: ``[2B, T, Dt]`` = cond
        rows then uncond rows); ``latents``: the start noise ``[B, C, F, Y, X]`` (else
        ``seed``'s draw for the whole video, :func:`~ditax.pipelines.sampling.initial_noise`:
        the same noise as the bidirectional sampler's for the same shape).
        ``cache`` / ``cache_threshold`` / ``cache_coefficients``: step caching inside each
        chunk (module docstring; None: every step runs).
        ``self.last_stats``: chunks, transformer_calls (forwards whose blocks ran, a batched
        CFG forward once, the cache writes included), cache shape / bytes, seconds to the
        first chunk; with a step cache also ``cache``, ``cache_threshold``, ``steps`` (of
        every chunk, counted on: chunk ``i``'s step ``j`` is step ``i S + j``) and
        ``skipped_steps`` (``{"cond": [...]}``: the steps whose blocks were skipped; with
        guidance both rows of a step skip or none).
        """
        model, causal, k = self.model, self.causal, self.chunk
        use_cfg = guidance_scale > 1.0
        b = text.shape[0] // (2 if use_cfg else 1)
        if use_cfg and text.shape[0] % 2:
            raise RequestError(f"guidance_scale={guidance_scale} needs text rows cond then "
                               f"uncond ([2B, T, Dt]); got {text.shape[0]} rows")
        causal.check_causal(k, self.context_chunks, model.cfg.patch_size[0], frames=num_frames)
        n = num_frames // k
        most = causal.max_chunks(model.cfg, k)
        if n > most:
            raise RequestError(f"num_frames={num_frames} latent frames are {n} chunks of {k}; "
                               f"RoPE's frame positions (model.rope_max_seq_len="
                               f"{model.cfg.rope_max_seq_len}) hold at most {most}; make fewer "
                               f"frames")
        shape = (b, model.cfg.in_channels, num_frames) + tuple(latent_hw)
        noise = initial_noise(seed, shape) if latents is None else jnp.asarray(latents,
                                                                                jnp.float32)
        if tuple(noise.shape) != shape:
            raise RequestError(f"latents shape {tuple(noise.shape)} does not match {shape}")
        window = self.context_chunks if self.context_chunks is not None else max(n - 1, 1)
        kv = causal.init_cache(model, text.shape[0], (k,) + tuple(latent_hw), window)
        state = set_timesteps(self.scheduler, num_inference_steps, shape[:2] + (k,) + shape[3:],
                              sigmas)   # a chunk's shape (multistep samplers keep history)
        steps = int(state.timesteps.shape[0])
        plan = self._step_cache(cache, cache_threshold, cache_coefficients, use_cfg, state,
                                noise[:, :, :k], text, kv)
        guidance = jnp.float32(guidance_scale)
        static = (self.gdef, causal, self.scheduler, use_cfg,
                  None if plan is None else plan.policy)
        self.last_stats = dict(chunks=0, cache_shape=tuple(kv.k.shape),
                               cache_bytes=2 * kv.k.size * kv.k.dtype.itemsize,
                               transformer_calls=0)
        if plan is not None:
            self.last_stats.update(cache=cache, cache_threshold=plan.threshold,
                                   cfg_cache=False, steps=0, skipped_steps={"cond": []})
        t0 = time.perf_counter()
        for i in range(n):
            extra = () if plan is None else (plan.tables, plan.carry)
            x, kv, carry = _chunk_program(*static, self.params, state,
                                          noise[:, :, i * k:(i + 1) * k], text, kv, guidance,
                                          *extra)
            x = jax.block_until_ready(x)
            st = self.last_stats
            ran = steps
            if plan is not None:    # a batched CFG forward: both branches skip or none
                plan.carry = carry
                codes = plan.stats()
                ran = len(codes["computed_steps"]["cond"])
                st["skipped_steps"]["cond"] += [i * steps + j for j in
                                                codes["skipped_steps"]["cond"]]
                st["steps"] += steps
            st.update(chunks=i + 1, transformer_calls=st["transformer_calls"] + ran + 1)
            st.setdefault("cache_shapes", set()).add(
                tuple(tuple(a.shape) for a in jax.tree.leaves(kv)))
            if i == 0:
                st["first_chunk_seconds"] = time.perf_counter() - t0
            yield x

    def _step_cache(self, cache, threshold, coefficients, use_cfg: bool, state, noise, text,
                    kv):
        """The chunk's :class:`~ditax.pipelines.cache.step_cache.StepCache` (None: no
        ``cache``): its policy, per-step tables and a zero carry for a chunk's
        ``noise``."""
        if cache is None and threshold is None:
            return None
        model = self.model
        timesteps = np.asarray(state.timesteps)
        plan = plan_step_cache(cache, threshold, False, use_cfg=use_cfg, cfg_mode="batched",
                               mesh=model.mesh, timesteps=timesteps, config=model.cfg,
                               num_train_timesteps=self.scheduler.num_train_timesteps,
                               experts=[model] * len(timesteps), coefficients=coefficients)
        dgdef, dparams = nnx.split(ChunkDenoiser(model, self.causal, kv))
        plan.carry, plan.axes = init_carry(Expert(dgdef, dparams, model.cfg), _chunk_inputs,
                                           plan.policy, noise, text, None, 1 + use_cfg,
                                           plan.num_branches, len(timesteps))
        return plan

    def sample(self, text, **kw) -> jax.Array:
        """The whole video's latents ``[B, C, F, Y, X]``: :meth:`stream`'s chunks joined."""
        return jnp.concatenate(list(self.stream(text, **kw)), axis=2)


__all__ = ["CausalSampler", "compiled_chunk_programs"]
