"""Whether the Wan VAE's decode fits a device, planned from shapes before any decode work.

The whole (chunked) decode needs at least one later chunk of one latent frame
(:meth:`~ditax.models.vae.wan.model.WanVAE.chunk_memory`'s estimate: the parameters, the
feature cache, the decoded video, the chunk's temporaries); the spatially tiled decode
(:mod:`.tiling`) needs one tile's chunk beside the tiles decoded before it (the blend holds
them all) and the blend's own program (the tiles and the video). Each is set against a
budget (:func:`.chunks.memory_budget`: 80% of the device's memory); the feature caches'
shapes come from tracing the first chunk (``eval_shape``: nothing runs, nothing compiles).

:class:`DecodeFit` holds the numbers; what a pipeline makes of them (decode whole, in tiles,
or refuse in one line) is :mod:`ditax.pipelines.decode_fit`'s.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from ditax.models.vae.wan.chunks import (ChunkMemory, chunk_frames, decode_chunk, is_fast,
                                         memory_budget, nbytes, resolve_path)

#: the tiles a pipeline decodes with (the defaults of ``WanVAE.decode``: diffusers' 256 /
#: 192 pixels)
TILE_MIN = (256, 256)
TILE_STRIDE = (192, 192)


class DecodeFit(NamedTuple):
    """A decode's plan on one device: ``size`` (``HxWxF`` of the video), ``dtype`` (the
    VAE's), ``budget`` bytes; ``whole``: the estimate of the whole decode (a later chunk of one
    latent frame), ``tiled``: the tiled decode's (None: one tile covers the frame, tiling
    changes nothing, or not planned: the whole decode fits), ``tile_frames``: latent frames
    a tile's later chunk within the budget beside the tiles held (None: the decoder's own
    choice, one on the plain path); ``per_frame``: bytes each further latent frame of a
    whole chunk adds (:meth:`chunk_bytes`)."""

    size: str
    dtype: str
    budget: int
    whole: int
    tiled: int | None
    tile_frames: int | None = None
    per_frame: int = 0

    def chunk_bytes(self, frames: int) -> int:
        """The whole decode's estimate with later chunks of ``frames`` latent frames."""
        return self.whole + (frames - 1) * self.per_frame

    @property
    def fits_whole(self) -> bool:
        return self.whole <= self.budget

    @property
    def fits_tiled(self) -> bool:
        return self.tiled is not None and self.tiled <= self.budget

    def in_bfloat16(self, n: int) -> int:
        """``n`` bytes of this plan in bfloat16: every term of the estimate (parameters,
        cache, activations, frames) is in the VAE's dtype, so it scales with the item size."""
        return n * 2 // jnp.dtype(self.dtype).itemsize


def first_cache(vae, lat: tuple[int, ...], path: str):
    """The feature cache (``jax.ShapeDtypeStruct`` s) after the first latent frame of
    channels-last latents of shape ``lat`` ``[B, F, Y, X, z]`` on ``path`` (resolved)."""
    graphdef, state = nnx.split(vae)
    z = jax.ShapeDtypeStruct((lat[0], 1, *lat[2:]), vae.dtype)
    # the jitted step's own trace (its cache: compiling the same chunk later traces nothing)
    return decode_chunk.eval_shape(graphdef, state, z, None, first=True, path=path)[1]


def plan_decode(vae, shape: tuple[int, ...], device=None, *, path: str = "auto",
                budget: int | None = None, tiles: bool = False,
                tile_min: tuple[int, int] = TILE_MIN,
                tile_stride: tuple[int, int] = TILE_STRIDE) -> DecodeFit:
    """The :class:`DecodeFit` of decoding latents of ``shape`` ``[B, z, F, Y, X]`` with ``vae``
    on ``device`` (its platform resolves ``path``; None: the default device) against
    ``budget`` bytes (None: :func:`.chunks.memory_budget` of ``device``), whole and, where
    that does not fit (or ``tiles``: always), in tiles of ``tile_min`` pixels every
    ``tile_stride`` (``WanVAE.decode``'s)."""
    b, z, f, y, x = shape
    path = resolve_path(path, device)
    budget = memory_budget(device) if budget is None else budget
    lat = (b, f, y, x, z)
    chunk = vae.chunk_memory(lat, first_cache(vae, lat, path))
    whole = chunk.bytes(1)
    sf, tf = vae.scale_factor_spatial, vae.scale_factor_temporal
    size = f"{y * sf}x{x * sf}x{1 + tf * (f - 1)}"
    ty, tx = tile_min[0] // sf, tile_min[1] // sf
    # one tile: WanVAE.decode(tiled=True) decodes it whole; fitting whole: no second trace
    if (y <= ty and x <= tx) or (whole <= budget and not tiles):
        return DecodeFit(size, vae.dtype.name, budget, whole, None, None, chunk.per_frame)
    ty, tx = min(ty, y), min(tx, x)
    tiles = len(range(0, y, tile_stride[0] // sf)) * len(range(0, x, tile_stride[1] // sf))
    tile = (b, f, ty, tx, z)
    one = vae.chunk_memory(tile, first_cache(vae, tile, path))
    held = (tiles - 1) * vae.video_bytes(tile)   # the tiles decoded before the last one
    blend = nbytes(nnx.state(vae)) + tiles * vae.video_bytes(tile) + vae.video_bytes(lat)
    memory = ChunkMemory(one.fixed + held, one.per_frame)
    tiled = max(memory.bytes(1), blend)
    frames = None
    if tiled <= budget and is_fast(path, device) and f > 1:
        frames = chunk_frames(f - 1, ty * tx * sf ** 2, True, None, memory, budget)
    return DecodeFit(size, vae.dtype.name, budget, whole, tiled, frames, chunk.per_frame)


__all__ = ["DecodeFit", "TILE_MIN", "TILE_STRIDE", "first_cache", "plan_decode"]
