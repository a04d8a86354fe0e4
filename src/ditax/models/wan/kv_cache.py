"""The KV cache of a block-causal Wan (issue 59): one chunk of latent frames at a time.

:func:`forward_chunk` runs the transformer on one chunk's tokens only. Each block's
self-attention attends to the cached keys / values of the earlier (clean) chunks plus the
chunk's own, through the model's own attention call with a key mask (any kernel); with
``write`` it stores the chunk's keys / values into the cache and advances it. Text (and
image) cross-attention is the transformer's, unchanged. Its parts, :func:`embed_chunk` and
:func:`chunk_blocks` (a range of blocks), are the denoiser protocol's ``embed`` /
``run_blocks`` on a chunk (the step cache's, :class:`~ditax.pipelines.causal.ChunkDenoiser`).

The cache (:class:`KVCache`) is a plain pytree of preallocated arrays, so that the chunk
step is one compiled program reused for every chunk:

- ``k`` / ``v``: ``[layers, B, S·L' + W, N, K]`` (or head-major ``[layers, B, N, S·L' + W,
  K]``, the layout the plan's kernel reads), ``S = 1 + context_chunks`` slots of ``L'``
  tokens (one chunk, padded to the context shards); slot 0 is the sink (chunk 0), slots
  ``1 .. S-1`` a ring of the last ``S - 1`` chunks (chunk ``i ≥ 1`` in slot
  ``1 + (i - 1) % (S - 1)``); then the work region of ``W ≥ L'`` keys
  (:func:`cache_tokens`): each layer's attention takes its layer of the cache (one copy
  out of the stacked array), writes the chunk's own keys / values there in place and
  attends to it as it lies — no concatenation of cache and chunk, no padding to the
  kernel's key block (``W`` is ``L'`` plus that padding; the stacked array's work region
  stays zeros);
- ``index``: int32 ``[]``, the chunks written so far = the next chunk's index. A slot is
  valid once ``slot < index``; with ``S - 1 ≥`` the chunks of the video nothing is evicted
  and the forward equals the whole-video block-causal one
  (:func:`~ditax.models.wan.causal.causal_forward`), else its sink + window mask.

RoPE positions are the chunk's frame index (``index · chunk / pt`` onward, not its slot),
so they continue past the teacher's training length, up to ``model.rope_max_seq_len``
patched frames (:func:`chunk_rope`; the caller checks the bound, a traced index cannot).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

from ditax.errors import RequestError
from ditax.intmath import round_up
from ditax.models.wan.attention import HEADS, TOKENS
from ditax.models.wan.causal import check_causal
from ditax.models.wan.embeddings import rope_split
from ditax.nn import axial_rope_angles, pair_tables
from ditax.nn.stack import run_stack
from ditax.parallel.rules import activation_spec


class KVCache(NamedTuple):
    """Keys, values (``[layers, B, S·L', N, K]``, or head-major ``[layers, B, N, S·L', K]``)
    and the chunks written so far (int32 ``[]``); see the module docstring."""

    k: jax.Array
    v: jax.Array
    index: jax.Array


def chunk_tokens(model, chunk_shape) -> tuple[tuple[int, int, int], int, int]:
    """``(grid, L, L')`` of one chunk of latent frames ``chunk_shape = (F_c, Y, X)``:
    patched grid, tokens, tokens padded to the context shards."""
    grid = tuple(int(n) // p for n, p in zip(chunk_shape, model.cfg.patch_size))
    n = grid[0] * grid[1] * grid[2]
    return grid, n, n + (-n) % model.sharding.seq_shards


def cache_tokens(model, tokens: int, slots: int) -> int:
    """Keys one layer of the cache holds: ``slots`` chunks of ``tokens`` (padded) tokens and
    the work region (the chunk's own keys), on one context shard padded to the key block the
    self-attention kernel takes for that many keys on its platform
    (:meth:`~ditax.attention.plan.AttentionCall.key_block`: splash / flash on a TPU, from the
    blocks table), when that is fewer than ``tokens`` more keys and the padded count is a
    whole number of the kernel's blocks, so the kernel pads nothing (the slots are ``keys //
    tokens - 1``). Wan 1.3B 480p on a v5e, sink + 3 chunks of 4,680 + the chunk: 23,400 ->
    24,576 keys."""
    n = (slots + 1) * tokens
    call = model.attention_plan.self_attn
    if model.sharding.seq_shards > 1 or (block := call.key_block(tokens, n)) is None:
        return n
    padded = round_up(n, block)
    if padded - n >= tokens or padded % call.key_block(tokens, padded):
        return n
    return padded


def init_cache(model, batch: int, chunk_shape, context_chunks: int) -> KVCache:
    """An empty cache for ``batch`` videos of chunks ``chunk_shape = (F_c, Y, X)`` latent
    frames / height / width, holding the sink and ``context_chunks`` earlier chunks (for a
    video of ``n`` chunks with nothing evicted: ``context_chunks = n - 1``)."""
    cfg = model.cfg
    check_causal(chunk_shape[0], context_chunks, cfg.patch_size[0],
                 sparsity=getattr(model.attention, "sparsity", "none"))
    _, _, lp = chunk_tokens(model, chunk_shape)
    s, n, kd = 1 + context_chunks, cfg.num_attention_heads, cfg.attention_head_dim
    head_major = model.attention_plan.self_attn.reads_head_major
    keys = cache_tokens(model, lp, s)
    shape = ((cfg.num_layers, batch, n, keys, kd) if head_major
             else (cfg.num_layers, batch, keys, n, kd))
    dt, mesh = jnp.dtype(cfg.dtype), model.sharding.mesh
    if mesh is None:   # two buffers: a chunk program donates both
        return KVCache(jnp.zeros(shape, dt), jnp.zeros(shape, dt), jnp.zeros((), jnp.int32))
    # made in place, sharded like the activations (batch over data / fsdp, tokens over
    # context, heads over tensor): no host copy of a cache that may be gigabytes
    spec = activation_spec((None,) + (HEADS if head_major else TOKENS), mesh)
    zeros = jax.jit(lambda: (jnp.zeros(shape, dt), jnp.zeros(shape, dt)),
                    out_shardings=NamedSharding(mesh, spec))
    return KVCache(*zeros(), jnp.zeros((), jnp.int32))


def cache_slots(model, cache: KVCache, tokens: int) -> int:
    """``S``, the cache's chunk slots, for chunks of ``tokens`` padded tokens; one clear
    line if the cache was made for another chunk size or layout."""
    head_major = model.attention_plan.self_attn.reads_head_major
    axis = 3 if head_major else 2
    cfg = model.cfg
    want = (cfg.num_layers, cfg.num_attention_heads, cfg.attention_head_dim)
    got = (cache.k.shape[0], cache.k.shape[2 if head_major else 3], cache.k.shape[-1])
    seq = cache.k.shape[axis] if cache.k.ndim == 5 else 0
    slots = seq // tokens - 1
    if slots < 1 or cache_tokens(model, tokens, slots) != seq or got != want or (
            cache.v.shape != cache.k.shape):
        raise RequestError(f"the KV cache k{tuple(cache.k.shape)} does not fit chunks of "
                           f"{tokens} tokens of this model ({'head' if head_major else 'token'}"
                           f"-major); make it with init_cache(model, batch, chunk_shape, ...)")
    return slots


@functools.lru_cache(maxsize=64)
def _axis_tables(dim: int, length: int, theta: float = 10000.0):
    """(cos, sin) ``[length, dim]`` float32 (host) of one RoPE axis: positions 0..length-1
    (the values of :func:`~ditax.models.wan.embeddings.rope_cos_sin`'s channels of it)."""
    return pair_tables(axial_rope_angles((dim,), (length,), theta))


def chunk_rope(cfg, grid, frame0):
    """(cos, sin) ``[F'·Y'·X', K]`` of a chunk's patched ``grid`` whose first frame is at
    position ``frame0`` (traced or not): the rows of the whole video's tables, taken from
    per-axis tables (frames: ``rope_max_seq_len`` positions) so the offset is dynamic."""
    f, y, x = grid
    parts = []
    for a, (d, n) in enumerate(zip(rope_split(cfg.attention_head_dim), grid)):
        tabs = _axis_tables(d, cfg.rope_max_seq_len if a == 0 else n)
        pick = []
        for t in tabs:
            t = jnp.asarray(t)
            if a == 0:
                t = jax.lax.dynamic_slice_in_dim(t, frame0, f, 0)
            shape = [1, 1, 1, d]
            shape[a] = n
            pick.append(jnp.broadcast_to(t.reshape(shape), (f, y, x, d)))
        parts.append(pick)
    cos = jnp.concatenate([p[0] for p in parts], -1).reshape(f * y * x, -1)
    sin = jnp.concatenate([p[1] for p in parts], -1).reshape(f * y * x, -1)
    return cos, sin


class CachedSelfAttention:
    """One layer's self-attention over ``[cached chunks, this chunk]``: the chunk's k / v
    written into the layer's keys ``k`` / ``v`` (the cache's, this layer's copy) at the work
    region's start ``work``, the wrapped call with ``kv_mask`` = valid cache slots ``mask``,
    the chunk's own key mask and the padding masked; records the chunk's k / v (``new``)
    for the caller to store."""

    def __init__(self, base, k, v, mask, sharding, work: int):
        self.base, self.k, self.v, self.mask, self.sharding = base, k, v, mask, sharding
        self.work, self.new = work, None

    @property
    def reads_head_major(self) -> bool:
        return self.base.reads_head_major

    def __call__(self, q, k, v, *, kv_mask=None, scale=None, head_major=False):
        self.new = (k, v)
        axis = 2 if head_major else 1
        b, lc = q.shape[0], k.shape[axis]
        own = jnp.ones((b, lc), bool) if kv_mask is None else kv_mask
        spec = HEADS if head_major else TOKENS
        at = [0, 0, 0, 0]
        at[axis] = self.work
        kk, vv = (self.sharding.constrain(jax.lax.dynamic_update_slice(
            layer.astype(new.dtype), new, at), spec) for layer, new in ((self.k, k), (self.v, v)))
        pad = jnp.zeros((b, self.k.shape[axis] - self.work - lc), bool)
        mask = jnp.concatenate([self.mask, own, pad], axis=1)
        return self.base(q, kk, vv, kv_mask=mask, scale=scale, head_major=head_major)


def forward_chunk(model, latent_chunk, timestep, encoder_hidden_states, cache: KVCache, *,
                  text_mask=None, encoder_hidden_states_image=None, write: bool = True):
    """Prediction ``[B, C_out, F_c, Y, X]`` for the chunk ``latent_chunk [B, C, F_c, Y, X]``
    (the cache's next chunk, ``cache.index``) and the cache after it.

    Only the chunk's tokens are computed; its self-attention sees the cache's valid slots
    and itself. ``write``: store the chunk's keys / values in its slot and advance
    ``index`` (a few-step sampler writes the clean chunk once); else the cache comes back
    as given. ``timestep``: ``[B]``, a scalar or per token ``[B, L_c]`` as the transformer's.
    :func:`embed_chunk`, :func:`chunk_blocks` over every block, the transformer's head.
    """
    h, ctx = embed_chunk(model, latent_chunk, timestep, encoder_hidden_states, cache,
                         text_mask=text_mask,
                         encoder_hidden_states_image=encoder_hidden_states_image)
    h, cache = chunk_blocks(model, h, ctx, cache, write=write)
    return model.head(h, ctx), cache


def embed_chunk(model, latent_chunk, timestep, encoder_hidden_states, cache: KVCache, *,
                text_mask=None, encoder_hidden_states_image=None):
    """The transformer's embedding of the chunk ``latent_chunk [B, C, F_c, Y, X]`` (the
    cache's next one): ``(tokens [B, L', D], context)``, the context's RoPE the chunk's frame
    positions (:func:`chunk_rope`)."""
    cfg = model.cfg
    if getattr(latent_chunk, "ndim", 0) != 5:
        raise RequestError(f"latent_chunk must be [B, C, F_c, Y, X] (rank 5); got shape "
                           f"{getattr(latent_chunk, 'shape', None)}")
    check_causal(latent_chunk.shape[2], 1, cfg.patch_size[0],
                 sparsity=getattr(model.attention, "sparsity", "none"))
    grid, seq, lp = chunk_tokens(model, latent_chunk.shape[2:])
    cache_slots(model, cache, lp)
    b = latent_chunk.shape[0]
    if cache.k.shape[1] != b:
        raise RequestError(f"latent_chunk has batch {b}; the KV cache was made for batch "
                           f"{cache.k.shape[1]}")
    h, ctx = model.embed(latent_chunk, timestep, encoder_hidden_states, text_mask,
                         encoder_hidden_states_image)
    cos, sin = chunk_rope(cfg, grid, jnp.asarray(cache.index, jnp.int32) * grid[0])
    if lp > seq:
        cos, sin = (jnp.pad(a, ((0, lp - seq), (0, 0))) for a in (cos, sin))
    return h, ctx._replace(rope=(cos, sin))


def chunk_blocks(model, h, ctx, cache: KVCache, start: int = 0, stop: int | None = None, *,
                 write: bool = False):
    """Blocks ``start .. stop-1`` (default: all) on the chunk's tokens ``h`` (context ``ctx``
    of :func:`embed_chunk`), each block's self-attention over its layer's cache and the chunk:
    ``(tokens, cache)``; ``write`` (every block, so the whole stack): the chunk's keys /
    values stored in its slot and ``index`` advanced."""
    cfg, sharding = model.cfg, model.sharding
    _, seq, lp = chunk_tokens(model, ctx.shape[2:])
    slots = cache_slots(model, cache, lp)
    b = h.shape[0]
    index = jnp.asarray(cache.index, jnp.int32)
    # valid slots (slot < index), each slot's padding keys masked
    per_slot = jnp.arange(slots) < index
    tok = jnp.arange(lp) < seq
    cache_mask = jnp.broadcast_to((per_slot[:, None] & tok[None]).reshape(-1), (b, slots * lp))
    slot = jnp.where(index == 0, 0, 1 + (index - 1) % max(slots - 1, 1))
    head_major = model.attention_plan.self_attn.reads_head_major
    axis = 3 if head_major else 2
    plan = model.attention_plan

    def body(carry, block):
        hs, layer, ck, cv = carry
        call = CachedSelfAttention(plan.self_attn, jax.lax.dynamic_index_in_dim(ck, layer, 0, False),
                                   jax.lax.dynamic_index_in_dim(cv, layer, 0, False),
                                   cache_mask, sharding, slots * lp)
        hs = block(hs, ctx.text, ctx.mod, ctx.rope, ctx.token_mask, ctx.text_mask,
                   dataclasses.replace(plan, self_attn=call), sharding, ctx.image)
        if write:
            at = [layer, 0, 0, 0, 0]
            at[axis] = slot * lp
            k_new, v_new = call.new
            ck = jax.lax.dynamic_update_slice(ck, k_new[None].astype(ck.dtype), at)
            cv = jax.lax.dynamic_update_slice(cv, v_new[None].astype(cv.dtype), at)
            ck, cv = (sharding.constrain(a, (None,) + (HEADS if head_major else TOKENS))
                      for a in (ck, cv))
        return hs, layer + 1, ck, cv

    stop = cfg.num_layers if stop is None else stop
    if write and (start, stop) != (0, cfg.num_layers):
        raise ValueError(f"a cache write runs every block, not {start}..{stop}")
    h, _, ck, cv = run_stack(model.blocks, body, (h, jnp.int32(start), cache.k, cache.v),
                             depth=cfg.num_layers, start=start, stop=stop, remat=cfg.remat,
                             scan=cfg.scan_layers, prefetch=cfg.offload_prefetch)
    return h, (KVCache(ck, cv, index + 1) if write else cache)


def max_chunks(cfg, chunk: int) -> int:
    """How many chunks of ``chunk`` latent frames fit RoPE's frame positions
    (``model.rope_max_seq_len`` patched frames)."""
    return cfg.rope_max_seq_len * cfg.patch_size[0] // chunk


def check_length(cfg, chunk: int, chunks: int, what: str = "frames") -> None:
    """One clear line if ``chunks`` chunks run past RoPE's frame positions."""
    most = max_chunks(cfg, chunk)
    if chunks > most:
        raise RequestError(f"{what}: {chunks} chunks of {chunk} latent frames run past "
                           f"model.rope_max_seq_len={cfg.rope_max_seq_len} frame positions "
                           f"(at most {most} chunks); make fewer frames")


__all__ = ["CachedSelfAttention", "KVCache", "cache_slots", "check_length", "chunk_blocks",
           "chunk_rope", "chunk_tokens", "embed_chunk", "forward_chunk", "init_cache",
           "max_chunks"]

