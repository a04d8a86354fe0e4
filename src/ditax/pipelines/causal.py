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

The family is reached through ``causal``, any object with ``init_cache(model, batch,
chunk_shape, context_chunks)``, ``forward_chunk(model, x, timestep, text, cache, write=)``,
``max_chunks(cfg, chunk)`` and ``check_causal(chunk, context_chunks, patch_t, frames=)`` —
a family's KV-cache module (Wan's: :mod:`ditax.models.wan.kv_cache`); nothing here names a
family.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Iterator, Optional

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.errors import RequestError
from ditax.pipelines.denoise import guide, scheduler_update
from ditax.pipelines.sampling import initial_noise, set_timesteps


def _velocity(model, causal, use_cfg: bool, x, t, text, guidance, cache):
    """The guided prediction for the chunk ``x`` at ``t`` against ``cache`` (not written)."""
    b = x.shape[0]
    xin = x.astype(jnp.dtype(model.cfg.dtype))
    if use_cfg:
        xin = jnp.concatenate([xin, xin])
    out, _ = causal.forward_chunk(model, xin, jnp.broadcast_to(t, (xin.shape[0],)), text, cache,
                                  write=False)
    return guide(out[:b], out[b:], guidance) if use_cfg else out


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3), donate_argnums=(8,))
def _chunk_program(gdef, causal, scheduler, use_cfg: bool, params, sched_state, noise, text,
                   cache, guidance):
    """One chunk: ``S`` Euler steps from ``noise [B, C, F_c, Y, X]`` (float32) against the
    cache, then the clean chunk's K/V written at t = 0. Returns ``(latents, cache)``; the
    step index lives in ``sched_state`` (traced), so one program serves every chunk."""
    def step(_, carry):
        x, st, p = carry
        t = st.timesteps[st.step_index].astype(jnp.float32)
        # the weights ride in the carry: NNX refuses a module whose values are an outer
        # trace's inside the blocks' scan (loop-invariant, XLA does not copy them)
        v = _velocity(nnx.merge(gdef, p), causal, use_cfg, x, t, text, guidance, cache)
        return scheduler_update(scheduler, st, v, x) + (p,)

    steps = sched_state.timesteps.shape[0]
    x, _, _ = jax.lax.fori_loop(0, steps, step, (noise, sched_state, params))
    model = nnx.merge(gdef, params)
    xin = x.astype(jnp.dtype(model.cfg.dtype))
    rows = text.shape[0]
    if use_cfg:
        xin = jnp.concatenate([xin, xin])
    _, cache = causal.forward_chunk(model, xin, jnp.zeros((rows,), jnp.float32), text, cache,
                                    write=True)
    return x, cache


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
               seed: int = 0, latents=None) -> Iterator[jax.Array]:
        """Yield the clean latent chunks ``[B, C, chunk, Y, X]`` (float32) one by one, each
        as soon as it is made, for a video of ``num_frames`` latent frames (a multiple of
        ``chunk``; any number of chunks up to the RoPE table's).

        ``text``: the text embeddings ``[B, T, Dt]`` (with guidance: ``[2B, T, Dt]`` = cond
        rows then uncond rows); ``latents``: the start noise ``[B, C, F, Y, X]`` (else
        ``seed``'s draw for the whole video, :func:`~ditax.pipelines.sampling.initial_noise`:
        the same noise as the bidirectional sampler's for the same shape).
        ``self.last_stats``: chunks, transformer_calls, cache shape / bytes, seconds to the
        first chunk.
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
        cache = causal.init_cache(model, text.shape[0], (k,) + tuple(latent_hw), window)
        state = set_timesteps(self.scheduler, num_inference_steps, shape[:2] + (k,) + shape[3:],
                              sigmas)   # a chunk's shape (multistep samplers keep history)
        guidance = jnp.float32(guidance_scale)
        static = (self.gdef, causal, self.scheduler, use_cfg)
        self.last_stats = dict(chunks=0, cache_shape=tuple(cache.k.shape),
                               cache_bytes=2 * cache.k.size * cache.k.dtype.itemsize,
                               transformer_calls=0)
        t0 = time.perf_counter()
        for i in range(n):
            x, cache = _chunk_program(*static, self.params, state, noise[:, :, i * k:(i + 1) * k],
                                      text, cache, guidance)
            x = jax.block_until_ready(x)
            st = self.last_stats
            st.update(chunks=i + 1, transformer_calls=st["transformer_calls"]
                      + num_inference_steps + 1)
            st.setdefault("cache_shapes", set()).add(
                tuple(tuple(a.shape) for a in jax.tree.leaves(cache)))
            if i == 0:
                st["first_chunk_seconds"] = time.perf_counter() - t0
            yield x

    def sample(self, text, **kw) -> jax.Array:
        """The whole video's latents ``[B, C, F, Y, X]``: :meth:`stream`'s chunks joined."""
        return jnp.concatenate(list(self.stream(text, **kw)), axis=2)


__all__ = ["CausalSampler", "compiled_chunk_programs"]
