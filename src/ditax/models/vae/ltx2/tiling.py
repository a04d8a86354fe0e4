"""Tiled encode / decode of LTX-2's video VAE with diffusers' ``AutoencoderKLLTX2Video`` tile
arithmetic: spatial tiles (``enable_tiling()``, diffusers' ``use_tiling``) and overlapping clips
in time (diffusers' ``use_framewise_decoding``, which also governs its encode), each alone or
nested (clips, each tiled in space).

With :class:`Tiles` in pixels / frames (``T`` the tile, ``S`` the stride), ``s`` / ``tf`` the
spatial / temporal factors:

- spatial decode: latent tiles of ``T/s`` every ``S/s``; decoded tiles blend with the (blended)
  tile above, then the one to the left, over ``T - S`` pixels, keep ``S``; the mosaic is cropped
  to the video's size;
- spatial encode: pixel tiles of ``T`` every ``S``; moments blend over ``T/s - S/s`` latent
  pixels, keep ``S/s``, cropped to the latent size;
- temporal decode: clips of ``T/tf + 1`` latent frames every ``S/tf``; each clip after the first
  loses its last decoded frame, blends with the previous (blended) clip over ``T - S`` frames and
  keeps ``S`` (the first keeps ``S + 1``); cropped to ``1 + tf (F' - 1)`` frames;
- temporal encode: clips of ``T + 1`` frames every ``S``; each after the first loses its first
  latent frame, blends over ``T/tf - S/tf`` latent frames and keeps ``S/tf`` (the first
  ``S/tf + 1``); cropped to the latent length.

A clip that would contribute nothing (one latent frame at the end: its only output frame is
the one dropped) is not computed. Blending is :mod:`ditax.nn.tiling`'s; each tile / clip is one
call of a compiled program, so one tile's activations bound the memory.
"""

from __future__ import annotations

import functools
import numbers
from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp

from ditax.errors import RequestError
from ditax.nn.tiling import blend, stitch

Program = Callable[[jax.Array], jax.Array]


@dataclass(frozen=True)
class Tiles:
    """Tile sizes and strides in pixels / frames; the defaults are diffusers'
    ``AutoencoderKLLTX2Video`` ones (512 px every 448 px; 16 frames every 8)."""

    tile_sample_min_height: int = 512
    tile_sample_min_width: int = 512
    tile_sample_min_num_frames: int = 16
    tile_sample_stride_height: int = 448
    tile_sample_stride_width: int = 448
    tile_sample_stride_num_frames: int = 8

    def check(self, spatial: int, temporal: int, where: str) -> None:
        """:class:`RequestError` unless every size is a positive multiple of its factor and no
        stride exceeds its tile (gaps)."""
        for axis, unit in (("height", spatial), ("width", spatial), ("num_frames", temporal)):
            lo = getattr(self, f"tile_sample_min_{axis}")
            st = getattr(self, f"tile_sample_stride_{axis}")
            for name, v in ((f"tile_sample_min_{axis}", lo), (f"tile_sample_stride_{axis}", st)):
                if not isinstance(v, numbers.Integral) or v <= 0 or v % unit:
                    raise RequestError(f"{where}: {name}={v!r} must be a positive multiple of "
                                       f"{unit}")
            if st > lo:
                raise RequestError(f"{where}: tile_sample_stride_{axis}={st} exceeds "
                                   f"tile_sample_min_{axis}={lo} (tiles would leave gaps); lower "
                                   "the stride")

    def latent(self, spatial: int, temporal: int) -> tuple[int, int, int, int, int, int]:
        """(min height, min width, min frames, stride height, stride width, stride frames) in
        latent units."""
        return (self.tile_sample_min_height // spatial, self.tile_sample_min_width // spatial,
                self.tile_sample_min_num_frames // temporal,
                self.tile_sample_stride_height // spatial, self.tile_sample_stride_width // spatial,
                self.tile_sample_stride_num_frames // temporal)


def decode_spatial(decode: Program, z: jax.Array, tiles: Tiles, spatial: int) -> jax.Array:
    """Latents ``[B, F, Y, X, C]`` → video ``[B, F*, sY, sX, c]`` tile by tile."""
    t = tiles
    my, mx, _, sy, sx, _ = t.latent(spatial, 1)
    mosaic = stitch(lambda i, j: decode(z[:, :, i:i + my, j:j + mx]),
                    range(0, z.shape[2], sy), range(0, z.shape[3], sx),
                    (t.tile_sample_min_height - t.tile_sample_stride_height,
                     t.tile_sample_min_width - t.tile_sample_stride_width),
                    (t.tile_sample_stride_height, t.tile_sample_stride_width), axes=(2, 3))
    return mosaic[:, :, :z.shape[2] * spatial, :z.shape[3] * spatial]


def encode_spatial(encode: Program, x: jax.Array, tiles: Tiles, spatial: int) -> jax.Array:
    """Video ``[B, F, H, W, c]`` → moments ``[B, F', H/s, W/s, C]`` tile by tile."""
    t = tiles
    my, mx, _, sy, sx, _ = t.latent(spatial, 1)
    mosaic = stitch(lambda i, j: encode(x[:, :, i:i + t.tile_sample_min_height,
                                          j:j + t.tile_sample_min_width]),
                    range(0, x.shape[2], t.tile_sample_stride_height),
                    range(0, x.shape[3], t.tile_sample_stride_width),
                    (my - sy, mx - sx), (sy, sx), axes=(2, 3))
    return mosaic[:, :, :x.shape[2] // spatial, :x.shape[3] // spatial]


def decode_temporal(decode: Program, z: jax.Array, tiles: Tiles, temporal: int) -> jax.Array:
    """Latents ``[B, F', Y, X, C]`` → video ``[B, 1 + tf (F' - 1), H, W, c]`` clip by clip
    (``decode`` maps a clip of latent frames to its frames; it may tile in space)."""
    t = tiles
    _, _, mf, _, _, sf = t.latent(1, temporal)
    clips = []
    for i in range(0, z.shape[1], sf):
        clip = z[:, i:i + mf + 1]
        if i and clip.shape[1] == 1:
            break   # decodes to one frame, which is dropped
        out = decode(clip)
        clips.append(out[:, :-1] if i else out)
    return _join(clips, t.tile_sample_min_num_frames - t.tile_sample_stride_num_frames,
                 t.tile_sample_stride_num_frames, 1 + temporal * (z.shape[1] - 1))


def encode_temporal(encode: Program, x: jax.Array, tiles: Tiles, temporal: int) -> jax.Array:
    """Video ``[B, F, H, W, c]`` → moments ``[B, 1 + (F - 1) / tf, Y, X, C]`` clip by clip."""
    t = tiles
    _, _, mf, _, _, sf = t.latent(1, temporal)
    clips = []
    for i in range(0, x.shape[1], t.tile_sample_stride_num_frames):
        clip = x[:, i:i + t.tile_sample_min_num_frames + 1]
        if i and clip.shape[1] == 1:
            break   # encodes to one latent frame, which is dropped
        out = encode(clip)
        clips.append(out[:, 1:] if i else out)
    return _join(clips, mf - sf, sf, (x.shape[1] - 1) // temporal + 1)


def _join(clips: list[jax.Array], extent: int, keep: int, total: int) -> jax.Array:
    return _time_mosaic(clips, extent=extent, keep=keep, total=total)


@functools.partial(jax.jit, static_argnames=("extent", "keep", "total"))
def _time_mosaic(clips, extent: int, keep: int, total: int) -> jax.Array:
    """Each clip after the first cross-faded with the previous (blended) one over ``extent``
    frames and cut to ``keep`` frames (the first to ``keep + 1``); joined and cut to ``total``."""
    out, prev = [clips[0][:, :keep + 1]], clips[0]
    for clip in clips[1:]:
        prev = blend(prev, clip, extent, axis=1)
        out.append(prev[:, :keep])
    return jnp.concatenate(out, axis=1)[:, :total]


__all__ = ["Tiles", "decode_spatial", "decode_temporal", "encode_spatial", "encode_temporal"]
