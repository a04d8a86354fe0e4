"""The checks of an LTX-2 request that need no model: one
:class:`~ditax.errors.RequestError` line naming the value and the fix.

LTX-2's video VAE compresses 32x in space and 8x in time, with the first frame alone
(causal): a video is ``8k + 1`` frames of a multiple of 32 on each side. A folder whose VAE has
other factors says so in its ``vae/config.json``; :func:`check_request` takes them."""

from __future__ import annotations

from ditax.errors import RequestError

SPATIAL, TEMPORAL = 32, 8


def check_size(height, width, spatial: int = SPATIAL) -> None:
    for name, v in (("height", height), ("width", width)):
        if v is not None and (v < spatial or v % spatial):
            near = max(spatial, round(v / spatial) * spatial)
            raise RequestError(f"{name}={v} must be a positive multiple of {spatial} (the "
                               f"VAE's {spatial}x); e.g. {near}")


def check_frames(num_frames, temporal: int = TEMPORAL) -> None:
    if num_frames is not None and (num_frames < 1 or (num_frames - 1) % temporal):
        near = max(1, round((num_frames - 1) / temporal)) * temporal + 1
        raise RequestError(f"num_frames={num_frames} must be {temporal}k+1 (the VAE keeps the "
                           f"first frame and packs {temporal} frames a latent frame); e.g. "
                           f"{near}")


def check_request(height=None, width=None, num_frames=None, spatial: int = SPATIAL,
                  temporal: int = TEMPORAL, decode_timestep=None, decode_noise_scale=None,
                  **fields) -> None:
    """Raise :class:`RequestError` for a request no LTX-2 folder of these VAE factors takes."""
    check_size(height, width, spatial)
    check_frames(num_frames, temporal)


__all__ = ["SPATIAL", "TEMPORAL", "check_frames", "check_request", "check_size"]
