"""How a pipeline's VAE decode runs, chosen from shapes before any work: whole, in spatial
tiles, or refused in one line.

``vae_tiling`` True / False (``sample.vae_tiling=true|false`` given, ``load_pipeline(
vae_tiling=...)``) is what runs; a row split over a mesh (``vae_parallel``) is kept as it is.
Left unset (None, the default), a VAE that plans its decode (``vae.plan_decode(shape, device,
budget=)``: the Wan 2.1 / 2.2 VAE, :mod:`ditax.models.vae.wan.fit`) is asked whether the
whole decode fits the device's budget (:func:`device_budget`); where it does not and the
spatial tiles do, the decode runs in tiles and says so in one warning line (the estimate, the
budget, the setting chosen); where the tiles do not fit either, the request is refused
(:class:`~ditax.errors.RequestError`, one line naming the sizes and the fixes) before anything
is encoded or denoised. A causal student's streamed decode (every piece whole, the feature
cache carried: no tiles) is checked the same way (:func:`check_stream`). CPUs are not planned
(their memory is the host's, not a chip's): they decode as asked, whole by default. VAEs
without a plan (FLUX.1's, FLUX.2's, LTX-2's) decode as asked too.
"""

from __future__ import annotations

import logging

import jax
import numpy as np

from ditax.errors import RequestError

log = logging.getLogger(__name__)

GIB = 2 ** 30


def device_budget(device) -> int | None:
    """The bytes a decode may take on ``device`` (80% of its memory:
    :func:`~ditax.models.vae.wan.chunks.memory_budget`); None on a CPU (not planned)."""
    if device is None or device.platform == "cpu":
        return None
    from ditax.models.vae.wan.chunks import memory_budget

    return memory_budget(device)


def _device(vae):
    """The device the VAE's parameters are on (the first of their placement; None without)."""
    from flax import nnx

    from ditax.models.vae.wan.chunks import device_of

    leaves = jax.tree.leaves(nnx.state(vae))
    return device_of(leaves[0]) if leaves else None


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def tiles_line(fit) -> str:
    """The one line a decode switched to tiles logs: the estimate, the budget, the setting."""
    bf16 = ""
    if np.dtype(fit.dtype).itemsize > 2 and fit.in_bfloat16(fit.whole) <= fit.budget:
        bf16 = "; in bfloat16 (model.vae_dtype=bfloat16) it fits whole"
    return (f"VAE decode: {fit.size} {fit.dtype} needs ~{_gib(fit.whole)} a chunk, over the "
            f"{_gib(fit.budget)} budget of the device: decoding in spatial tiles "
            f"(~{_gib(fit.tiled)}; sample.vae_tiling=true, set false to decode whole){bf16}")


def refusal_line(fit) -> str:
    """The one line of a decode that fits neither whole nor in tiles, with the fixes."""
    tiled = ("one spatial tile covers the frame" if fit.tiled is None
             else f"~{_gib(fit.tiled)} in spatial tiles")
    bf16 = (", decode in bfloat16 (model.vae_dtype=bfloat16)"
            if np.dtype(fit.dtype).itemsize > 2 else "")
    return (f"VAE decode: {fit.size} {fit.dtype} needs ~{_gib(fit.whole)} a chunk whole and "
            f"{tiled}, over the {_gib(fit.budget)} budget of the device; lower --height / "
            f"--width / --frames{bf16}, or split the rows over more chips "
            f"(sample.vae_parallel=true with a mesh)")


def _plan(pipe, shape):
    """``pipe``'s VAE's plan for latents of ``shape`` on its device (one trace per shape and
    budget, kept on the pipeline); None where not planned (no plan, a CPU)."""
    plan = getattr(pipe.vae, "plan_decode", None)
    if plan is None:
        return None
    device = _device(pipe.vae)
    budget = device_budget(device)
    if budget is None:
        return None
    fits = pipe.__dict__.setdefault("_decode_fits", {})
    key = (tuple(int(n) for n in shape), budget)
    if key not in fits:
        fits[key] = plan(key[0], device, budget=budget)
    return fits[key]


def check_stream(pipe, shape) -> None:
    """A streamed decode of pieces of latents of ``shape`` ``[B, C, n + 1, Y, X]`` (the
    first frame and ``n`` more a piece, decoded whole) within the device's budget, else a
    :class:`RequestError` in one line before any work; nothing where not planned."""
    fit = _plan(pipe, shape)
    n = max(int(shape[2]) - 1, 1)
    if fit is None or fit.chunk_bytes(n) <= fit.budget:
        return
    bf16 = (", or decode in bfloat16 (model.vae_dtype=bfloat16)"
            if np.dtype(fit.dtype).itemsize > 2 else "")
    raise RequestError(f"VAE decode: a streamed chunk of {n} latent frames at "
                       f"{fit.size.rsplit('x', 1)[0]} {fit.dtype} needs "
                       f"~{_gib(fit.chunk_bytes(n))}, over the {_gib(fit.budget)} "
                       f"budget of the device (a stream decodes whole frames); lower --height "
                       f"/ --width{bf16}")


def decode_options(pipe, shape) -> dict:
    """``pipe``'s VAE decode options for latents of ``shape`` ``[B, C, F, Y, X]`` (module
    docstring): ``{"tiled": bool}``, with the tiles' ``frames_per_chunk`` where the plan chose
    it; logs the switch to tiles, raises :class:`RequestError` where nothing fits."""
    tiling = getattr(pipe, "vae_tiling", None)
    if tiling is not None or getattr(pipe, "vae_parallel", None) is not None:
        return {"tiled": bool(tiling)}
    fit = _plan(pipe, shape)
    if fit is None or fit.fits_whole:
        return {"tiled": False}
    if not fit.fits_tiled:
        raise RequestError(refusal_line(fit))
    log.warning("%s", tiles_line(fit))
    out = {"tiled": True}
    if fit.tile_frames is not None:
        out["frames_per_chunk"] = fit.tile_frames
    return out


__all__ = ["check_stream", "decode_options", "device_budget", "refusal_line", "tiles_line"]
