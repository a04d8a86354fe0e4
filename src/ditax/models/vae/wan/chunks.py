"""One chunk of the Wan VAE's streaming encode / decode, as jitted pure functions, and the
decode's chunking.

``encode_chunk`` / ``decode_chunk`` are functions of ``(graphdef, state, chunk, cache)``,
compiled once per (chunk shape, ``first``, ``path``) and reused for every chunk of every video
of that shape: ``graphdef`` is static (hashable), the feature cache is an ordinary pytree
argument and is donated, so the new cache can reuse its buffers (peak memory: one cache, not
two). Chunks are channels-last: encoder input ``[B, f, H, W, 3]`` (the first frame, then
``temporal_factor`` frames at a time), decoder input ``[B, n, Y, X, z_dim]``: the first latent
frame alone (``first=True``: it decodes to one frame), then ``n`` latent frames a chunk (any
``n``: the causal cache makes every split give the same frames).

The decoder's ``path``: ``"plain"`` (the layers as written: XLA convolutions), ``"fast"``
(the TPU fast path of :mod:`.layers`: channels padded to 128, Pallas convolution kernels of
:mod:`.conv_tpu`, sub-pixel upsampling), ``"interpret"`` (the fast path with its kernels
interpreted: CPU tests), ``"auto"`` (plain; fast on a TPU once :data:`FAST_BY_DEFAULT` is
set, after the chip has timed it against plain: ``benchmarks/vae_decode.py``; a row split
is always plain). :func:`chunk_frames` picks the decoder's latent frames per chunk after the first.
The compiled objects are public so that benchmarks can ``lower(...).compile()`` them;
:func:`compile_decode` compiles the decoder's two programs ahead of time for one latent shape
(concurrently: XLA compiles without the GIL).
"""

from __future__ import annotations

import functools
import math
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import jax
from flax import nnx

from ditax.models.vae.wan.layers import FastPath, fast_path
from ditax.parallel.platform import platform_of

PATHS = ("auto", "plain", "fast", "interpret")
#: whether ``auto`` takes the fast path on a TPU: not until ``benchmarks/vae_decode.py`` has
#: shown it faster on a chip (compiled for a v5e and equal to plain on CPU; not yet timed)
FAST_BY_DEFAULT = False
#: pixels of the decoder's top level per chunk that "auto" chunking aims at: 4 latent frames
#: (16 frames) at 480x832 — each later chunk then costs one program launch and 2 cache frames
#: per 16, and its activations stay at a few GB (about 0.4 GB a frame at 720p on the fast path)
CHUNK_PIXELS = 16 * 480 * 832


def _path(path: str) -> FastPath | None:
    if path not in PATHS:
        raise ValueError(f"WanVAE decode: path={path!r} is not one of {PATHS}")
    platform = platform_of().name
    if path == "auto":     # the fast path is opt-in until a chip has timed it (FAST_BY_DEFAULT)
        path = "fast" if platform == "tpu" and FAST_BY_DEFAULT else "plain"
    elif path == "fast" and platform != "tpu":
        raise ValueError(f"WanVAE decode: path='fast' runs Pallas TPU kernels and the platform "
                         f"is {platform}; use path='auto' (or 'interpret' to run the TPU program "
                         "interpreted, slowly)")
    return {"plain": None, "fast": FastPath(), "interpret": FastPath(interpret=True)}[path]


def is_fast(path: str) -> bool:
    """Whether ``path`` decodes on the fast path here (``auto`` asks the platform)."""
    return _path(path) is not None


@functools.partial(jax.jit, static_argnames=("graphdef", "first"), donate_argnames=("cache",))
def encode_chunk(graphdef, state, x, cache, *, first: bool):
    """Frames ``[B, f, H, W, 3]`` → (posterior moments ``[B, f', Y, X, 2 z_dim]``, new cache)."""
    vae = nnx.merge(graphdef, state)
    h, cache = vae.encoder(x, cache, first)
    return vae.quant_conv(h)[0], cache


@functools.partial(jax.jit, static_argnames=("graphdef", "first", "path"),
                   donate_argnames=("cache",))
def decode_chunk(graphdef, state, z, cache, *, first: bool, path: str = "auto"):
    """Latent frames ``[B, n, Y, X, z_dim]`` → (unclipped frames ``[B, f, H, W, 3]``, new
    cache); ``f`` is 1 for the first chunk (``n`` = 1) and ``temporal_factor * n`` after it."""
    vae = nnx.merge(graphdef, state)
    with fast_path(_path(path)):
        x = vae.post_quant_conv(z)[0]
        return vae.decoder(x, cache, first)


class DecodePrograms(NamedTuple):
    """A decode's chunk steps: ``first(state, z[:, :1], None)`` and ``rest(state, chunk,
    cache)`` for chunks of ``frames`` latent frames (``rest`` None for one latent frame)."""

    first: object
    rest: object
    frames: int


def chunk_frames(later: int, top_pixels: int, fast: bool, frames: int | None = None) -> int:
    """Latent frames per chunk for ``later`` latent frames after the first: ``frames`` when
    given (at most ``later``), else on the fast path as many as keep a chunk's top-level
    pixels (``top_pixels`` per frame) near :data:`CHUNK_PIXELS`, else 1; then evened out over
    the chunks that number needs (the last chunk is padded with zero latents, which a causal
    decoder ignores)."""
    if later < 1:
        return 1
    if frames is None:
        frames = max(1, CHUNK_PIXELS // (4 * top_pixels)) if fast else 1
    if frames < 1:
        raise ValueError(f"WanVAE decode: frames_per_chunk={frames} must be at least 1")
    chunks = math.ceil(later / min(frames, later))
    return math.ceil(later / chunks)


def jitted_decode(graphdef, frames: int, path: str) -> DecodePrograms:
    """The jitted chunk steps (compiled on first use) as :class:`DecodePrograms`."""
    return DecodePrograms(functools.partial(decode_chunk, graphdef, first=True, path=path),
                          functools.partial(decode_chunk, graphdef, first=False, path=path),
                          frames)


def compile_decode(graphdef, state, z, *, frames: int = 1, path: str = "auto") -> DecodePrograms:
    """Ahead-of-time ``decode_chunk`` programs for channels-last latents ``z`` ``[B, F, Y, X,
    z_dim]`` (an array or ``jax.ShapeDtypeStruct``; its sharding, if any, is the chunks'), the
    later chunks of ``frames`` latent frames; each program is called as ``program(state,
    chunk, cache)`` like the jitted function without its static arguments. The same programs
    the jitted calls compile, so results are identical; both compile at once."""
    sharding = getattr(z, "sharding", None)
    chunk = lambda n: jax.ShapeDtypeStruct((z.shape[0], n, *z.shape[2:]), z.dtype,  # noqa: E731
                                           sharding=sharding)
    first = decode_chunk.lower(graphdef, state, chunk(1), None, first=True, path=path)
    if z.shape[1] == 1:
        return DecodePrograms(first.compile(), None, frames)
    rest = decode_chunk.lower(graphdef, state, chunk(frames), first.out_info[1], first=False,
                              path=path)
    with ThreadPoolExecutor(2) as pool:
        done = [pool.submit(lowered.compile) for lowered in (first, rest)]
        return DecodePrograms(done[0].result(), done[1].result(), frames)


__all__ = ["CHUNK_PIXELS", "DecodePrograms", "PATHS", "chunk_frames", "compile_decode",
           "decode_chunk", "encode_chunk", "is_fast", "jitted_decode"]
