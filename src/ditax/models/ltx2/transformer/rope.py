"""LTX-2's rotary position embedding: token coordinates, their positions, the cos / sin tables
and the rotation (diffusers ``LTX2AudioVideoRotaryPosEmbed`` and ``apply_*_rotary_emb``).

- **Coordinates** (:func:`video_coords`, :func:`audio_coords`): each token's ``[start, end)``
  in pixel space and seconds — video ``[B, 3, L, 2]`` (time in seconds, height, width in
  pixels), audio ``[B, 1, La, 2]`` (seconds) — as diffusers' ``prepare_video_coords`` /
  ``prepare_audio_coords`` compute them from the latent sizes (or as the caller passes them).
- **Positions** (:func:`positions`): each token's midpoint over its axis's base size,
  ``[B, S, P]`` float32. Computed on the host when the coordinates are concrete (a division
  by a base such as 20: XLA on CPU divides by multiplying with the reciprocal, one ulp off
  IEEE in a third of the values, and the highest RoPE frequency, ``θ·π/2 ≈ 1.6e4``, turns one
  ulp of a position into 1e-3 rad); traced coordinates are divided in the graph.
- **Tables** (:func:`rope_tables`): ``cos, sin [B, S, G, W]`` float32. The angles are
  ``(2·position − 1) · θ^linspace(0, 1, n) · π/2``, ``n = dim / (2P)`` frequencies per axis,
  ordered frequency-major (axis fastest) and padded at the front with zero angles to
  ``dim / 2``. ``interleaved`` (LTX-2's default): each angle on a channel pair ``(2i,
  2i+1)``, ``W = dim / G`` channels a group; ``split`` (LTX-2 / 2.3 releases): the channels
  of each of ``G`` groups are two halves rotated together, ``W = dim / (2G)`` angles a group.
  ``G`` is diffusers' head count of that RoPE — the video heads for the video side of the
  audio↔video attentions, even though those have audio heads.
- **Rotation** (:func:`apply_rope`): ``x [B, S, N, K]`` regrouped to ``[B, S, G, dim/G]``
  (a view when ``G = N``), rotated in float32, rounded once to ``x``'s dtype.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class Rope(NamedTuple):
    """One RoPE table: ``cos``, ``sin`` ``[B', S, G, W]`` float32 (``B'`` 1 or the batch)."""

    cos: jax.Array
    sin: jax.Array


class Positions(NamedTuple):
    """The four position grids of one call (:func:`positions`): video ``[B', L, 3]`` and its
    time over the a↔v base ``[B', L, 1]``; audio ``[B', La, 1]`` and over the a↔v base."""

    video: object
    video_cross: object
    audio: object
    audio_cross: object


# -- coordinates (host, float32: diffusers' arithmetic) -------------------------------------------

def _f32(x) -> np.float32:
    return np.float32(x)


def video_coords(num_frames: int, height: int, width: int, *, patch_size: int,
                 patch_size_t: int, scale_factors, causal_offset: int,
                 fps: float) -> np.ndarray:
    """Video token boundaries ``[1, 3, L, 2]`` float32 of a ``num_frames x height x width``
    latent (tokens frame-major): latent patch ``[start, end)`` times the VAE factors, the
    time axis shifted by ``causal_offset - factor`` (the causal first frame), clipped at 0
    and divided by ``fps`` (seconds)."""
    grids = [np.arange(0, n, p, dtype=np.float32)
             for n, p in ((num_frames, patch_size_t), (height, patch_size), (width, patch_size))]
    start = np.stack(np.meshgrid(*grids, indexing="ij"), 0).reshape(3, -1)       # [3, L]
    patch = np.asarray([patch_size_t, patch_size, patch_size], np.float32)[:, None]
    coords = np.stack([start, start + patch], -1)                                 # [3, L, 2]
    coords = coords * np.asarray(scale_factors, np.float32)[:, None, None]
    t = np.maximum(coords[0] + _f32(causal_offset) - _f32(scale_factors[0]), _f32(0))
    coords[0] = t / _f32(fps)
    return coords[None]


def audio_coords(num_frames: int, *, patch_size_t: int, scale_factor: int,
                 causal_offset: int, hop_length: int, sampling_rate: int) -> np.ndarray:
    """Audio token boundaries ``[1, 1, La, 2]`` float32 (seconds) of ``num_frames`` latent
    audio frames: mel frames ``[start, end)`` (shifted by ``causal_offset - factor``,
    clipped at 0) times ``hop_length / sampling_rate``."""
    f = np.arange(0, num_frames, patch_size_t, dtype=np.float32)
    s = _f32(scale_factor)

    def seconds(frames):
        mel = np.maximum(frames * s + _f32(causal_offset) - s, _f32(0))
        return mel * _f32(hop_length) / _f32(sampling_rate)

    out = np.stack([seconds(f), seconds(f + _f32(patch_size_t))], -1)              # [La, 2]
    return out[None, None]


# -- positions ------------------------------------------------------------------------------

def _concrete(x):
    """``x`` as numpy when its values are known now (not traced), else None."""
    if isinstance(x, np.ndarray):
        return x
    try:
        return np.asarray(x)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError,
            RuntimeError):
        return None


def positions(coords, bases) -> object:
    """``[B, P, S, 2]`` boundaries (or ``[B, P, S]`` midpoints) → ``[B, S, P]`` float32
    midpoints over ``bases`` (one per axis; the first ``len(bases)`` axes of ``coords``
    are read). numpy when ``coords`` are concrete, jnp when traced (see the module
    docstring)."""
    host = _concrete(coords)
    xp = np if host is not None else jnp
    c = (host if host is not None else coords).astype(xp.float32)
    if c.ndim == 4:
        c = (c[..., 0] + c[..., 1]) / xp.float32(2.0)
    return xp.stack([c[:, i] / xp.float32(b) for i, b in enumerate(bases)], -1)


# -- tables ---------------------------------------------------------------------------------

def _linspace(n: int, dtype) -> np.ndarray:
    """``torch.linspace(0, 1, n)``'s values: the first half stepped up from 0, the second down
    from 1, in ``dtype`` arithmetic (torch's vectorised loop rounds some float32 values the
    other way; in float64 the frequencies it gives are the same float32 numbers)."""
    if n == 1:
        return np.zeros(1, dtype)
    i = np.arange(n)
    step = (dtype(1) - dtype(0)) / dtype(n - 1)
    lo = (dtype(0) + step * i.astype(dtype)).astype(dtype)
    hi = (dtype(1) - step * (n - 1 - i).astype(dtype)).astype(dtype)
    return np.where(i < n // 2, lo, hi).astype(dtype)


def frequencies(n: int, theta: float, double: bool) -> np.ndarray:
    """``θ^linspace(0, 1, n) · π/2`` float32 ``[n]`` (float64 arithmetic with ``double``, as
    ``rope_double_precision``; float32 otherwise, where torch's and numpy's ``pow`` may differ
    by an ulp)."""
    dt = np.float64 if double else np.float32
    return (np.power(dt(theta), _linspace(n, dt)) * dt(math.pi) / dt(2.0)).astype(np.float32)


def rope_tables(pos, dim: int, groups: int, *, theta: float, double: bool,
                split: bool) -> Rope:
    """The (cos, sin) :class:`Rope` ``[B', S, G, W]`` of positions ``pos [B', S, P]`` for a
    ``dim``-wide projection (see the module docstring for the layout)."""
    b, s, p = pos.shape
    n = dim // (2 * p)
    freqs = jnp.asarray(frequencies(n, theta, double))
    ang = (jnp.asarray(pos, jnp.float32)[..., None] * 2 - 1) * freqs               # [B, S, P, n]
    ang = jnp.swapaxes(ang, -1, -2).reshape(b, s, n * p)
    cos, sin = jnp.cos(ang), jnp.sin(ang)
    if split:
        pad = dim // 2 - n * p
        width = dim // (2 * groups)
    else:
        cos, sin = jnp.repeat(cos, 2, axis=-1), jnp.repeat(sin, 2, axis=-1)
        pad = dim % (2 * p)
        width = dim // groups
    if pad:
        cos = jnp.concatenate([jnp.ones((b, s, pad), cos.dtype), cos], -1)
        sin = jnp.concatenate([jnp.zeros((b, s, pad), sin.dtype), sin], -1)
    return Rope(cos.reshape(b, s, groups, width), sin.reshape(b, s, groups, width))


def apply_rope(x, rope: Rope, split: bool, head_major: bool = False):
    """``x [B, S, N, K]`` rotated by ``rope`` (``[B', S, G, W]``): float32 inside, ``x``'s
    dtype out. ``interleaved``: ``out[2i] = x[2i]·cos − x[2i+1]·sin``, ``out[2i+1] =
    x[2i+1]·cos + x[2i]·sin``; ``split``: the halves ``x1, x2`` of each group give
    ``x1·cos − x2·sin`` and ``x2·cos + x1·sin``."""
    if head_major:       # x [B, N, S, K], the groups being the heads: the tables' view
        cos, sin = (jnp.swapaxes(t, 1, 2) for t in rope)
        xf = x.astype(jnp.float32)
        if split:
            x1, x2 = jnp.split(xf, 2, axis=-1)
            out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
        else:
            pairs = xf.reshape(xf.shape[:-1] + (-1, 2))
            partner = jnp.stack([-pairs[..., 1], pairs[..., 0]], -1).reshape(xf.shape)
            out = xf * cos + partner * sin
        return out.astype(x.dtype)
    b, s, n, k = x.shape
    g = rope.cos.shape[2]
    xf = x.astype(jnp.float32).reshape(b, s, g, n * k // g)
    if split:
        x1, x2 = jnp.split(xf, 2, axis=-1)
        out = jnp.concatenate([x1 * rope.cos - x2 * rope.sin, x2 * rope.cos + x1 * rope.sin], -1)
    else:
        pairs = xf.reshape(xf.shape[:-1] + (-1, 2))
        partner = jnp.stack([-pairs[..., 1], pairs[..., 0]], -1).reshape(xf.shape)
        out = xf * rope.cos + partner * rope.sin
    return out.reshape(b, s, n, k).astype(x.dtype)


__all__ = ["Rope", "Positions", "video_coords", "audio_coords", "positions", "frequencies",
           "rope_tables", "apply_rope"]
