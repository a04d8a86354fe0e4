"""Trainable sparse attention (``attention.sparsity=vsa``): video sparse attention (VSA; Zhang
et al. 2025, "VSA: Faster video diffusion with trainable sparse attention") over tile-major
tokens (:mod:`.tiles`: a tile of ``t`` tokens is one contiguous block).

- **coarse**: q, k, v mean-pooled per tile (the tile's real tokens only: ``kv_mask``), dense
  attention over the pooled tokens; each query tile's pooled output ``o_c`` is broadcast back to
  the tile's tokens. From the pooled scores each query tile (per batch row and head) picks its
  ``topk`` key tiles (``lax.top_k`` of the scores under ``stop_gradient``: the choice is an
  index, not differentiated).
- **fine**: each query tile's tokens attend the tokens of its ``topk`` key tiles only
  (``o_f``).
- **gate**: ``o = o_f + g_c * o_c``, with ``g_c`` ``[B, L, N, K]`` a learned per-token
  projection of the layer's input (the attention layer's ``to_gate_compress``, initialised to
  zero, so a layer fine-tuned from a dense checkpoint starts as block-sparse attention over
  the top-k tiles; ``g_f = 1`` fixed, as in VSA's released code).

:func:`vsa_attention` is the fast path: the fine stage gathers each query tile's selected key /
value tiles (``[B, N, tiles, topk, t, K]``: work ``topk / tiles`` of dense) and runs a dense
softmax over them (:func:`fine`), or hands each query tile with its gathered tiles to a
kernel as one batch row (:func:`fine_call`: ``attention.backend=flash``, the kernel's online
softmax, no scores held). :func:`vsa_reference` is the slow reference: its own pooling (a
pooling matrix), its own selection, and dense ``L x L`` attention under the selected tiles'
token mask. Backward by autodiff (the gather's transpose is a scatter-add; the flash
kernel's own backward). With ``attention.vsa_fine=table`` the fine stage runs on Pallas
kernels that read the picks as a scalar-prefetched per-(sample, head, query tile) table, no
gather (:mod:`.vsa_table`; forward and backward all Pallas).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

F32 = jnp.float32


def _check(q, tile_len: int, topk: int) -> int:
    """The number of tiles of ``q [B, L, N, K]``; ValueError for a length that is not whole
    tiles or a ``topk`` outside ``1 .. tiles``."""
    length = q.shape[1]
    if length % tile_len:
        raise ValueError(f"vsa: {length} tokens are not whole {tile_len}-token tiles; lay the "
                         f"tokens out tile-major (ditax.attention.sparse.tiles.TileOrder)")
    tiles = length // tile_len
    if not 1 <= topk <= tiles:
        raise ValueError(f"vsa: topk={topk} must be in 1..{tiles} (the key tiles)")
    return tiles


def pool(x, tile_len: int, kv_mask=None):
    """``x [B, L, N, K]`` → ``[B, L / t, N, K]`` float32: each tile's mean over its real tokens
    (``kv_mask [B, L]``: True = real; every tile must hold one)."""
    b, length, n, k = x.shape
    xt = x.reshape(b, length // tile_len, tile_len, n, k).astype(F32)
    if kv_mask is None:
        return xt.mean(2)
    w = kv_mask.reshape(b, length // tile_len, tile_len, 1, 1).astype(F32)
    return (xt * w).sum(2) / jnp.maximum(w.sum(2), 1.0)


def coarse(q, k, v, tile_len: int, topk: int, kv_mask=None, scale=None):
    """``(o_c [B, L, N, K] float32, picks [B, N, tiles, topk] int32)``: the pooled attention's
    output broadcast to the tokens, and each query tile's top-``topk`` key tiles."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    qc, kc, vc = (pool(x, tile_len, kv_mask) for x in (q, k, v))
    s = jnp.einsum("bqnk,btnk->bnqt", qc, kc) * scale
    o = jnp.einsum("bnqt,btnk->bqnk", jax.nn.softmax(s, axis=-1), vc)
    picks = jax.lax.top_k(jax.lax.stop_gradient(s), topk)[1]
    return jnp.repeat(o, tile_len, axis=1), picks


def fine(q, k, v, picks, tile_len: int, kv_mask=None, scale=None):
    """``[B, L, N, K]`` float32: each query tile's tokens over the tokens of its ``picks``
    ``[B, N, tiles, topk]`` key tiles (gathered; padding keys masked by ``kv_mask``)."""
    b, length, n, kd = q.shape
    nt, topk = length // tile_len, picks.shape[-1]
    scale = kd ** -0.5 if scale is None else scale

    def heads(x):      # [B, L, N, K] -> [B, N, tiles, t, K]
        return x.reshape(b, nt, tile_len, n, kd).transpose(0, 3, 1, 2, 4)

    bi = jnp.arange(b)[:, None, None, None]
    ni = jnp.arange(n)[None, :, None, None]
    kg, vg = heads(k)[bi, ni, picks], heads(v)[bi, ni, picks]      # [B, N, tiles, topk, t, K]
    s = jnp.einsum("bnqsk,bnqjtk->bnqsjt", heads(q), kg, preferred_element_type=F32) * scale
    if kv_mask is not None:
        real = kv_mask.reshape(b, nt, tile_len)[bi, picks]          # [B, N, tiles, topk, t]
        s = jnp.where(real[:, :, :, None], s, -jnp.inf)
    p = jax.nn.softmax(s.reshape(b, n, nt, tile_len, topk * tile_len), axis=-1)
    o = jnp.einsum("bnqsjt,bnqjtk->bnqsk", p.reshape(s.shape), vg.astype(F32))
    return o.transpose(0, 2, 3, 1, 4).reshape(b, length, n, kd)


def fine_call(q, k, v, picks, tile_len: int, call, kv_mask=None, scale=None):
    """:func:`fine` through an attention call (``call(q, k, v, kv_mask=, scale=)``: e.g. the
    ``flash`` kernel): each query tile one batch row of ``t`` queries over its gathered
    ``topk · t`` keys, so the kernel's online softmax runs on the picked tiles only. Each head
    picks its own tiles; the heads stay heads (``[B·tiles, ·, N, K]``) unless a key mask is
    given: a padded tile's mask then differs by head, so each (sample, head, query tile) is
    its own row (``[B·N·tiles, ·, 1, K]``, the mask following the row's tiles)."""
    b, length, n, kd = q.shape
    nt, topk = length // tile_len, picks.shape[-1]

    def heads(x):      # [B, L, N, K] -> [B, N, tiles, t, K]
        return x.reshape(b, nt, tile_len, n, kd).transpose(0, 3, 1, 2, 4)

    bi = jnp.arange(b)[:, None, None, None]
    ni = jnp.arange(n)[None, :, None, None]
    kg, vg = (heads(x)[bi, ni, picks] for x in (k, v))          # [B, N, tiles, topk, t, K]
    if kv_mask is None:
        kg, vg = (x.transpose(0, 2, 3, 4, 1, 5).reshape(b * nt, topk * tile_len, n, kd)
                  for x in (kg, vg))
        o = call(q.reshape(b * nt, tile_len, n, kd), kg, vg, scale=scale)
        return o.reshape(b, length, n, kd)
    rows = b * n * nt
    kg, vg = (x.reshape(rows, topk * tile_len, 1, kd) for x in (kg, vg))
    mask = kv_mask.reshape(b, nt, tile_len)[bi, picks].reshape(rows, topk * tile_len)
    o = call(heads(q).reshape(rows, tile_len, 1, kd), kg, vg, kv_mask=mask, scale=scale)
    return o.reshape(b, n, nt, tile_len, kd).transpose(0, 2, 3, 1, 4).reshape(b, length, n, kd)


def combine(o_f, o_c, gate, dtype):
    """``o_f + g_c * o_c`` in ``dtype`` (``gate`` None: ``g_c = 0``, the fine branch only)."""
    return (o_f if gate is None else o_f + gate.astype(F32) * o_c).astype(dtype)


def vsa_attention(q, k, v, gate=None, *, tile_len: int, topk: int, kv_mask=None, scale=None,
                  call=None):
    """VSA (module docstring), the fast path: q, k, v ``[B, L, N, K]`` tile-major (``L`` whole
    ``tile_len`` tiles), ``gate`` ``[B, L, N, K]`` (``g_c``) or None, ``kv_mask [B, L]`` the
    real tokens → ``[B, L, N, K]`` in q's dtype. ``call``: an attention call the fine stage
    runs through (:func:`fine_call`; None: the jnp softmax of :func:`fine`), or one that
    ``reads_picks`` (:class:`~ditax.attention.sparse.vsa_table.TableFine`: the table
    kernels, no gather)."""
    _check(q, tile_len, topk)
    o_c, picks = coarse(q, k, v, tile_len, topk, kv_mask, scale)
    if call is None:
        o_f = fine(q, k, v, picks, tile_len, kv_mask, scale)
    elif getattr(call, "reads_picks", False):      # the table kernels (vsa_fine=table)
        o_f = call(q, k, v, picks, tile_len, kv_mask, scale)
    else:
        o_f = fine_call(q, k, v, picks, tile_len, call, kv_mask, scale).astype(F32)
    return combine(o_f, o_c, gate, q.dtype)


def vsa_reference(q, k, v, gate=None, *, tile_len: int, topk: int, kv_mask=None, scale=None):
    """The slow reference of :func:`vsa_attention`: pooling by a ``[tiles, L]`` matrix, dense
    ``L x L`` attention under the selected tiles' token mask (small sizes only)."""
    b, length, n, kd = q.shape
    nt = _check(q, tile_len, topk)
    scale = kd ** -0.5 if scale is None else scale
    tile = jnp.arange(length) // tile_len
    real = jnp.ones((b, length), bool) if kv_mask is None else kv_mask
    w = (tile[None, None, :] == jnp.arange(nt)[None, :, None]) & real[:, None, :]
    pooling = w / w.sum(-1, keepdims=True)                                  # [B, tiles, L]
    qc, kc, vc = (jnp.einsum("bcl,blnk->bcnk", pooling, x.astype(F32)) for x in (q, k, v))
    s = jnp.einsum("bcnk,bdnk->bncd", qc, kc) * scale
    o_c = jnp.einsum("bncd,bdnk->bcnk", jax.nn.softmax(s, axis=-1), vc)[:, tile]
    chosen = jax.nn.one_hot(jax.lax.top_k(jax.lax.stop_gradient(s), topk)[1], nt).sum(-2) > 0
    keep = chosen[:, :, tile][:, :, :, tile] & real[:, None, None, :]     # [B, N, L, L]
    sf = jnp.einsum("blnk,btnk->bnlt", q.astype(F32), k.astype(F32)) * scale
    p = jax.nn.softmax(jnp.where(keep, sf, -jnp.inf), axis=-1)
    o_f = jnp.einsum("bnlt,btnk->blnk", p, v.astype(F32))
    return combine(o_f, o_c, gate, q.dtype)


def vsa_density(tiles: int, tile_len: int, topk: int) -> float:
    """The share of dense attention's score / value FLOPs VSA computes on ``tiles`` tiles of
    ``tile_len`` tokens: the fine stage's ``topk / tiles`` plus the coarse stage's ``(tiles /
    L)² = 1 / tile_len²``."""
    return topk / tiles + 1.0 / tile_len ** 2


@dataclass(frozen=True)
class VsaCall:
    """The self-attention call of a model under ``attention.sparsity=vsa``: the
    :class:`~ditax.attention.AttentionCall` interface (token-major ``[B, L, N, K]``) plus
    ``gate=`` (``g_c``); ``gated`` tells the attention layer to compute its gate. ``inner``:
    the kernel call the fine stage runs through (``attention.backend=flash``: the flash
    call over gathered tiles, or with ``vsa_fine=table`` a
    :class:`~ditax.attention.sparse.vsa_table.TableFine`), or None (jnp)."""

    tile_len: int
    topk: int
    inner: Any = None
    reads_head_major: bool = False
    gated: bool = True

    @property
    def backend(self) -> str:
        return "xla" if self.inner is None else self.inner.backend

    def __call__(self, q, k, v, *, kv_mask=None, scale=None, head_major: bool = False,
                 gate=None):
        if head_major:
            raise ValueError("attention.sparsity=vsa runs token-major [B, L, N, K] only")
        return vsa_attention(q, k, v, gate, tile_len=self.tile_len, topk=self.topk,
                             kv_mask=kv_mask, scale=scale, call=self.inner)


__all__ = ["VsaCall", "coarse", "fine", "fine_call", "pool", "vsa_attention", "vsa_density",
           "vsa_reference"]
