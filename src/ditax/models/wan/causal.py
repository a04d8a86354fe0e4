"""Block-causal Wan (issue 59): self-attention causal over chunks of latent frames.

The video's latent frames are cut into chunks of ``chunk`` frames (``model.causal_chunk``);
the tokens of chunk ``i`` attend to the tokens of chunks ``≤ i`` (text and image
cross-attention unchanged). With ``context_chunks = W`` (``sample.context_chunks``, long
videos) chunk ``i`` sees the sink (chunk 0), the ``W`` chunks before it and itself: the
window the KV cache of :mod:`ditax.models.wan.kv_cache` holds, so the whole-video forward
here is the reference its chunk-by-chunk forward must equal.

:func:`causal_forward` runs the transformer's own embedding, blocks and head
(:class:`~ditax.models.wan.transformer.WanTransformer`, weights shared) with the plan's
self-attention replaced by a masked call:

- :class:`ChunkMaskedCall` (default): the model's own kernel (xla, splash, ...), once per
  query chunk, with that chunk's allowed keys as the ``kv_mask`` — any backend that takes a
  key mask runs it, no element mask needed;
- :class:`DenseMaskedCall` (``reference=True``): dense float32 attention under the
  ``[L, L]`` block-causal element mask — slow, simple, the oracle.

:func:`causal_plan` is that swap for one embedded video, the one call a transformer's
``run_blocks`` needs to honour the ``model.causal_chunk`` config field (so a model built from
a causal config runs block-causal everywhere: ``ditax bench``, training, a plain call).

Tokens are frame-major, so token ``l`` lies in latent frame ``(l // (Y'·X'))·pt``; a last
chunk may be shorter (the whole-video forward does not need ``chunk`` to divide the frames;
the cache does).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from ditax.errors import ConfigError, RequestError


def _count(x) -> bool:
    """Whether ``x`` is a positive int (numpy's too; not a bool)."""
    return not isinstance(x, bool) and isinstance(x, (int, np.integer)) and x >= 1


def check_causal(chunk, context_chunks=None, patch_t: int = 1, frames: Optional[int] = None,
                 sparsity: str = "none") -> None:
    """Raise :class:`ConfigError` (one line: the value and the fix) unless ``chunk`` latent
    frames per chunk, ``context_chunks`` and — when given, where whole chunks are required
    (the KV cache, the chunk sampler) — ``frames`` latent frames fit together; the first
    rule broken is the one said."""
    if not _count(chunk):
        raise ConfigError(f"model.causal_chunk={chunk!r} must be a positive number of latent "
                          f"frames per chunk (e.g. model.causal_chunk=3)")
    lo = hi = 0
    if frames is not None:
        lo, hi = frames // chunk * chunk, (frames // chunk + 1) * chunk
    rules = (
        (chunk % patch_t == 0,
         f"model.causal_chunk={chunk} is not a multiple of the temporal patch size {patch_t} "
         f"(model.patch_size); use a multiple of {patch_t}"),
        (context_chunks is None or _count(context_chunks),
         f"sample.context_chunks={context_chunks!r} must be >= 1 (chunks kept beside the sink "
         f"chunk) or unset (every previous chunk)"),
        (sparsity == "none",
         f"model.causal_chunk={chunk} needs dense self-attention: attention.sparsity="
         f"{sparsity} reorders the tokens tile-major; set attention.sparsity=none"),
        (frames is None or frames % chunk == 0,
         f"latent frames={frames} are not a whole number of chunks of model.causal_chunk="
         f"{chunk}; use {lo or hi} or {hi} latent frames, or a causal_chunk that divides "
         f"{frames}"),
    )
    broken = next((message for holds, message in rules if not holds), None)
    if broken is not None:
        raise ConfigError(broken)


def token_chunks(grid, chunk: int, patch_t: int = 1, length: Optional[int] = None) -> np.ndarray:
    """Chunk index ``[L']`` of each frame-major token of a patched grid ``(F', Y', X')``;
    tokens past the grid (padding up to ``length``) get the last chunk's index."""
    f, y, x = (int(n) for n in grid)
    ids = (np.arange(f) * patch_t // chunk).repeat(y * x)
    if length is not None and length > ids.size:
        ids = np.concatenate([ids, np.full(length - ids.size, ids[-1])])
    return ids


def allowed_chunks(query_chunk, key_chunk, context_chunks: Optional[int] = None):
    """Whether a key of ``key_chunk`` may be attended by a query of ``query_chunk`` (arrays
    broadcast): earlier or the same chunk, and with a window the sink or one of the last
    ``context_chunks`` chunks."""
    ok = key_chunk <= query_chunk
    if context_chunks is not None:
        ok = ok & ((key_chunk == 0) | (key_chunk >= query_chunk - context_chunks))
    return ok


def block_causal_mask(ids: np.ndarray, context_chunks: Optional[int] = None) -> np.ndarray:
    """The ``[L, L]`` element mask (True = attend) of tokens with chunk indices ``ids``."""
    return allowed_chunks(ids[:, None], ids[None, :], context_chunks)


class DenseMaskedCall:
    """Dense float32 attention under a fixed ``[L', L']`` element mask (and the key mask);
    the oracle (token-major, like the ``xla`` call)."""

    reads_head_major = False

    def __init__(self, mask):
        self.mask = jnp.asarray(mask)

    def __call__(self, q, k, v, *, kv_mask=None, scale=None, head_major=False):
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        keep = self.mask[None] if kv_mask is None else self.mask[None] & kv_mask[:, None, :]
        s = jnp.einsum("blnk,btnk->bnlt", q.astype(jnp.float32), k.astype(jnp.float32)) * scale
        s = jnp.where(keep[:, None], s, -jnp.inf)
        p = jax.nn.softmax(s, axis=-1)
        return jnp.einsum("bnlt,btnk->blnk", p, v.astype(jnp.float32)).astype(q.dtype)


class ChunkMaskedCall:
    """The model's self-attention call run once per query chunk, with the keys that chunk may
    attend as its ``kv_mask``: block-causal attention through any kernel that takes a key
    mask (the layout, head- or token-major, is the wrapped call's).

    Each call takes that chunk's query rows when every chunk's rows start and end on a
    multiple of ``shards`` (the sequence shards: a slice keeps q split evenly over them);
    else every call takes all queries and each row keeps its chunk's output (the same
    values, ``chunks`` times the attention work)."""

    def __init__(self, base, ids: np.ndarray, context_chunks: Optional[int] = None,
                 shards: int = 1):
        self.base, self.ids, self.context_chunks = base, ids, context_chunks
        bounds = np.flatnonzero(np.diff(ids)) + 1
        self.sliced = not (bounds % shards).any() and ids.size % shards == 0

    @property
    def reads_head_major(self) -> bool:
        return self.base.reads_head_major

    def __call__(self, q, k, v, *, kv_mask=None, scale=None, head_major=False):
        axis = 2 if head_major else 1
        b, outs = q.shape[0], []
        out = None
        for c in range(int(self.ids.max()) + 1):
            rows = np.flatnonzero(self.ids == c)
            keys = jnp.asarray(allowed_chunks(c, self.ids, self.context_chunks))
            mask = jnp.broadcast_to(keys, (b, keys.size))
            mask = mask if kv_mask is None else mask & kv_mask
            if self.sliced:
                qc = jax.lax.slice_in_dim(q, int(rows[0]), int(rows[-1]) + 1, axis=axis)
                outs.append(self.base(qc, k, v, kv_mask=mask, scale=scale,
                                      head_major=head_major))
                continue
            o = self.base(q, k, v, kv_mask=mask, scale=scale, head_major=head_major)
            mine = jnp.asarray(self.ids == c).reshape((-1, 1) if head_major else (-1, 1, 1))
            out = jnp.where(mine, o, 0 if out is None else out)
        return jnp.concatenate(outs, axis=axis) if self.sliced else out


def run_blocks(model, h, ctx, plan):
    """All of ``model``'s blocks on tokens ``h [B, L', D]`` with attention ``plan`` (the
    transformer's :meth:`run_blocks`, its plan swapped; scan, remat and offload kept)."""
    return model.run_blocks(h, ctx, plan=plan)


def causal_plan(model, ctx, chunk: Optional[int] = None, context_chunks: Optional[int] = None,
                reference: bool = False):
    """The attention plan ``model``'s blocks run for the embedded video ``ctx``
    (:class:`~ditax.models.wan.transformer.Embedded`): the model's, its self-attention
    block-causal over chunks of ``chunk`` latent frames (None: ``model.cfg.causal_chunk``
    where the config has one; unset, the plan is the model's own). ``reference``: the dense
    element-masked oracle instead of the model's kernel."""
    plan = ctx.plan(model.attention_plan)
    chunk = getattr(model.cfg, "causal_chunk", None) if chunk is None else chunk
    if chunk is None:
        return plan
    cfg = model.cfg
    check_causal(chunk, context_chunks, cfg.patch_size[0],
                 sparsity=getattr(model.attention, "sparsity", "none"))
    grid = tuple(n // p for n, p in zip(ctx.shape[2:], cfg.patch_size))
    ids = token_chunks(grid, chunk, cfg.patch_size[0], length=ctx.seq + ctx.pad)
    if reference:   # the dense [L', L'] oracle; copied tokens' keys never attended
        mask = block_causal_mask(ids, context_chunks)
        mask[:, ctx.seq + ctx.pad - getattr(ctx, "copies", 0):] = False
        call = DenseMaskedCall(mask)
    else:           # the chunk calls' key masks; the copies kept out by the kernel
        call = ChunkMaskedCall(plan.self_attn, ids, context_chunks, model.sharding.seq_shards)
    return dataclasses.replace(plan, self_attn=call)


def causal_forward(model, latents, timestep, encoder_hidden_states, *, chunk: int,
                   context_chunks: Optional[int] = None, text_mask=None,
                   encoder_hidden_states_image=None, reference: bool = False):
    """The block-causal prediction ``[B, C_out, F, Y, X]`` of a Wan ``model`` for the whole
    video ``latents [B, C, F, Y, X]`` (arguments as :meth:`WanTransformer.__call__`).

    ``chunk`` latent frames per chunk (any ``chunk ≥ F`` is the bidirectional forward);
    ``context_chunks``: the sink + window of the KV cache (None: every earlier chunk);
    ``reference``: dense attention under the element mask instead of the model's kernel.
    """
    check_causal(chunk, context_chunks, model.cfg.patch_size[0],
                 sparsity=getattr(model.attention, "sparsity", "none"))
    if getattr(latents, "ndim", 0) != 5:
        raise RequestError(f"latents must be [B, C, F, Y, X] (rank 5); got shape "
                           f"{getattr(latents, 'shape', None)}")
    h, ctx = model.embed(latents, timestep, encoder_hidden_states, text_mask,
                         encoder_hidden_states_image)
    h = run_blocks(model, h, ctx, causal_plan(model, ctx, chunk, context_chunks, reference))
    return model.head(h, ctx)


__all__ = ["ChunkMaskedCall", "DenseMaskedCall", "allowed_chunks", "block_causal_mask",
           "causal_forward", "causal_plan", "check_causal", "run_blocks", "token_chunks"]
