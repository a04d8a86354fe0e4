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
interpreted: CPU tests), ``"packed"`` / ``"interpret-packed"`` (those with each kernel's
taps in one contraction, real channels packed: :mod:`.conv_tpu_pack`), ``"auto"`` (plain;
on a TPU fast while :data:`FAST_BY_DEFAULT` is set, packed while :data:`PACKED_BY_DEFAULT`
is too, each after the chip timed it and matched its frames: ``benchmarks/vae_decode.py``;
a row split is always plain), or a :class:`~.layers.FastPath` itself (diagnosis: packing
restricted to some channel counts, ``benchmarks/vae_decode.py --bisect``; hashable: each one its own programs).
:func:`chunk_frames` picks the decoder's latent frames per chunk after the first: on the fast
path as many as keep a chunk near :data:`CHUNK_PIXELS`, fewer where a later chunk's
program (:class:`ChunkMemory`: parameters, feature cache, temporaries, the decoded video) would
take more than :func:`memory_budget` of the device's memory.
The compiled objects are public so that benchmarks can ``lower(...).compile()`` them;
:func:`compile_decode` compiles the decoder's two programs ahead of time for one latent shape
(concurrently: XLA compiles without the GIL).
"""

from __future__ import annotations

import functools
import logging
import math
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, NamedTuple

import jax
from flax import nnx

from ditax.models.vae.wan.layers import FastPath, fast_path
from ditax.parallel.platform import device_platform, platform_of

log = logging.getLogger(__name__)

PATHS = ("auto", "plain", "fast", "interpret", "packed", "interpret-packed")
#: whether ``auto`` takes the fast path on a TPU: yes since a v5e timed it (bf16, 81 frames:
#: 480x832 3.44 s against the plain path's 4.89 s, 720x1280 8.61 s against 11.9 s;
#: docs/tpu_v5e.md); its values equal plain's with the kernels interpreted on CPU
#: (tests/models/vae/test_wan_vae_fast.py) and compiled on a chip (tests/tpu/test_chip_vae.py)
FAST_BY_DEFAULT = True
#: whether ``auto``'s fast path packs the kernels' taps (``"packed"``; :class:`FastPath`
#: ``pack``): yes since a v5e decoded 480x832x81 in bf16 packed as fast's frames (session 65,
#: with conv_out unpacked: :meth:`FastPath.pack_for`; docs/tpu_v5e.md)
PACKED_BY_DEFAULT = True
#: pixels of the decoder's top level per chunk that "auto" chunking aims at: 4 latent frames
#: (16 frames) at 480x832 — each later chunk then costs one program launch and 2 cache frames
#: per 16, and its temporaries stay at a few GB (on the fast path in bf16 about 1 KB a pixel a
#: frame: 6.1 GiB for 16 frames of 480x832, 0.88 GiB a frame at 720p; deviceless v5e compiles)
CHUNK_PIXELS = 16 * 480 * 832
#: the share of a device's memory (``memory_stats()["bytes_limit"]``) a later chunk's program may
#: take by :class:`ChunkMemory`'s estimate; the rest is the estimate's margin and the caller's
MEMORY_FRACTION = 0.8
#: a device's memory where it reports none (CPU, deviceless compiles): a TPU v5e's 15.75 GiB
#: (its ``bytes_limit``), the smallest HBM of the TPUs ditax targets
DEFAULT_MEMORY_BYTES = int(15.75 * 2**30)
#: a later chunk's temporaries on the fast path, in activations of the decoder's top level
#: (channels padded) per output frame: deviceless TPU v5e compiles of the Wan 2.1 decoder in
#: bf16 at 480x832 and 720x1280 with 1, 2 and 4 latent frames a chunk measured 4.0 (1023 bytes a
#: pixel a frame, 128 channels; docs/vae_decode_memory_v5e.jsonl)
TEMP_ACTIVATIONS = 4


def device_of(placed):
    """One device of an array's or a sharding's placement; None without one (a tracer, none
    given: :func:`resolve_path` and :func:`memory_budget` then ask the default device)."""
    try:
        return min(getattr(placed, "sharding", placed).device_set, key=lambda d: d.id)
    except Exception:   # a tracer, None
        return None


def resolve_path(path: str | FastPath, device=None) -> str | FastPath:
    """``path`` with ``"auto"`` made concrete for the platform of ``device`` (the device the
    decode runs on: its parameters' or latents'; None: :func:`platform_of`'s): ``"fast"`` on
    a TPU while :data:`FAST_BY_DEFAULT`, else ``"plain"``. Checked: a name in :data:`PATHS`
    or a :class:`FastPath`, ``"fast"`` (a FastPath not ``interpret``) only on a TPU."""
    if not isinstance(path, FastPath) and path not in PATHS:
        raise ValueError(f"WanVAE decode: path={path!r} is not one of {PATHS}")
    platform = (platform_of() if device is None else device_platform(device)).name
    if isinstance(path, FastPath):
        if not path.interpret and platform != "tpu":
            raise ValueError(f"WanVAE decode: {path} runs Pallas TPU kernels and the platform "
                             f"is {platform}; set interpret=True to run them interpreted")
        return path
    if path == "auto":
        if platform == "tpu" and FAST_BY_DEFAULT:
            return "packed" if PACKED_BY_DEFAULT else "fast"
        return "plain"
    if path in ("fast", "packed") and platform != "tpu":
        raise ValueError(f"WanVAE decode: path={path!r} runs Pallas TPU kernels and the platform "
                         f"is {platform}; use path='auto' (or 'interpret' to run the TPU program "
                         "interpreted, slowly)")
    return path


def _path(path: str | FastPath) -> FastPath | None:
    path = resolve_path(path)
    if isinstance(path, FastPath):
        return path
    return {"plain": None, "fast": FastPath(), "interpret": FastPath(interpret=True),
            "packed": FastPath(pack=True),
            "interpret-packed": FastPath(interpret=True, pack=True)}[path]


def is_fast(path: str | FastPath, device=None) -> bool:
    """Whether ``path`` decodes on the fast path on ``device`` (``auto`` asks its platform)."""
    return resolve_path(path, device) != "plain"


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
    cache)`` for chunks of ``frames`` latent frames (``rest`` None for one latent frame);
    ``cache``: the feature cache's shapes (``jax.ShapeDtypeStruct`` s) where compiled ahead of
    time."""

    first: object
    rest: object
    frames: int
    cache: object = None


class ChunkMemory(NamedTuple):
    """A later chunk's program's memory, estimated: ``fixed`` bytes whatever its length (the
    parameters, the feature cache, in and out aliased: it is donated, the decoded video) and
    ``per_frame`` bytes a latent frame of the chunk (temporaries, its output frames)."""

    fixed: int
    per_frame: int

    def bytes(self, frames: int) -> int:
        """The estimate for chunks of ``frames`` latent frames."""
        return self.fixed + frames * self.per_frame


def nbytes(tree) -> int:
    """Bytes of a pytree of arrays or ``jax.ShapeDtypeStruct`` s."""
    return sum(math.prod(a.shape) * a.dtype.itemsize for a in jax.tree.leaves(tree))


def memory_budget(device=None) -> int:
    """:data:`MEMORY_FRACTION` of ``device``'s memory (``memory_stats()["bytes_limit"]``, else
    :data:`DEFAULT_MEMORY_BYTES`: CPUs and deviceless TPUs report none; None: the default
    device)."""
    try:
        device = jax.devices()[0] if device is None else device
        limit = (device.memory_stats() or {}).get("bytes_limit")
    except Exception:   # a deviceless one: "only supported for addressable PjRt devices"
        limit = None
    return int(MEMORY_FRACTION * (limit or DEFAULT_MEMORY_BYTES))


def chunk_frames(later: int, top_pixels: int, fast: bool, frames: int | None = None,
                 memory: ChunkMemory | None = None, budget: int | None = None) -> int:
    """Latent frames per chunk for ``later`` latent frames after the first: ``frames`` when
    given (at most ``later``), else on the fast path as many as keep a chunk's top-level
    pixels (``top_pixels`` per frame) near :data:`CHUNK_PIXELS` and, given ``memory``, its
    estimate within ``budget`` bytes (:func:`memory_budget`'s by default; at least 1 frame),
    else 1; then evened out over the chunks that number needs (the last chunk is padded with
    zero latents, which a causal decoder ignores)."""
    if later < 1:
        return 1
    if frames is None:
        frames = max(1, CHUNK_PIXELS // (4 * top_pixels)) if fast else 1
        if fast and memory is not None:
            budget = memory_budget() if budget is None else budget
            frames = max(1, min(frames, (budget - memory.fixed) // max(1, memory.per_frame)))
            if memory.bytes(1) > budget:
                log.warning("WanVAE decode: a chunk of one latent frame needs about %.1f GiB "
                            "(estimated), over the %.1f GiB budget of the device; it may run "
                            "out of memory (decode in tiles: tiled=True, a pipeline's "
                            "sample.vae_tiling=true; bfloat16 takes half)",
                            memory.bytes(1) / 2**30, budget / 2**30)
    if frames < 1:
        raise ValueError(f"WanVAE decode: frames_per_chunk={frames} must be at least 1")
    chunks = math.ceil(later / min(frames, later))
    return math.ceil(later / chunks)


def jitted_decode(graphdef, frames: int, path: str) -> DecodePrograms:
    """The jitted chunk steps (compiled on first use) as :class:`DecodePrograms`."""
    return DecodePrograms(functools.partial(decode_chunk, graphdef, first=True, path=path),
                          functools.partial(decode_chunk, graphdef, first=False, path=path),
                          frames)


def compile_decode(graphdef, state, z, *, frames: int | Callable = 1,
                   path: str = "auto") -> DecodePrograms:
    """Ahead-of-time ``decode_chunk`` programs for channels-last latents ``z`` ``[B, F, Y, X,
    z_dim]`` (an array or ``jax.ShapeDtypeStruct``; its sharding, if any, is the chunks'), the
    later chunks of ``frames`` latent frames (or of ``frames(cache)``: a function of the first
    chunk's feature cache, ``jax.ShapeDtypeStruct`` s); each program is called as
    ``program(state, chunk, cache)`` like the jitted function without its static arguments.
    The same programs the jitted calls compile, so results are identical; both compile at
    once."""
    sharding = getattr(z, "sharding", None)
    chunk = lambda n: jax.ShapeDtypeStruct((z.shape[0], n, *z.shape[2:]), z.dtype,  # noqa: E731
                                           sharding=sharding)
    first = decode_chunk.lower(graphdef, state, chunk(1), None, first=True, path=path)
    cache = first.out_info[1]
    if callable(frames):
        frames = frames(cache)
    if z.shape[1] == 1:
        return DecodePrograms(first.compile(), None, frames, cache)
    rest = decode_chunk.lower(graphdef, state, chunk(frames), cache, first=False, path=path)
    with ThreadPoolExecutor(2) as pool:
        done = [pool.submit(lowered.compile) for lowered in (first, rest)]
        return DecodePrograms(done[0].result(), done[1].result(), frames, cache)


__all__ = ["CHUNK_PIXELS", "ChunkMemory", "DEFAULT_MEMORY_BYTES", "DecodePrograms",
           "MEMORY_FRACTION", "PATHS", "TEMP_ACTIVATIONS", "chunk_frames", "compile_decode",
           "decode_chunk", "device_of", "encode_chunk", "is_fast", "jitted_decode", "memory_budget",
           "nbytes", "resolve_path"]
